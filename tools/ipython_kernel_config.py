# IPython kernels started from .venv read this at start (`make setup` copies it to
# .venv/etc/ipython/): the kernel is lbsgd.kernel.Kernel, ipykernel's own with its shutdown race
# closed (lbsgd/kernel.py says why), and its log drops the unencrypted-TCP warning and the ZMQ
# traceback of a reply to a client that has gone (lbsgd/kernel_log.py); every other record passes.
import logging

try:
    from lbsgd import kernel_log
except ImportError:  # lbsgd not installed in this environment: the kernel as it is
    pass
else:
    kernel_log.install(logging.getLogger("IPKernelApp"))
    try:
        import lbsgd.kernel  # noqa: F401
    except Exception:  # an ipykernel whose classes lbsgd.kernel cannot extend: its own kernel
        pass
    else:
        get_config().IPKernelApp.kernel_class = "lbsgd.kernel.Kernel"  # noqa: F821 (IPython's)
