# IPython kernels started from .venv read this at start (`make setup` copies it to
# .venv/etc/ipython/): the kernel's log drops the unencrypted-TCP warning and the ZMQ traceback of
# a reply to a client that has gone (lbsgd/kernel_log.py says why); every other record passes.
import logging

try:
    from lbsgd import kernel_log
except ImportError:  # lbsgd not installed in this environment: the kernel as it is
    pass
else:
    kernel_log.install(logging.getLogger("IPKernelApp"))
