"""lbsgd.kernel: the notebooks' kernel closes IOPub only after its control thread has answered a
shutdown request whole, where ipykernel's own closes it under that thread's last message (the
race that aborts a kernel at the end of a papermill run).

The race is widened on purpose: a probe subclass of each kernel sleeps before the control
thread's last message of the shutdown and then records whether IOPub's thread is still running.
ipykernel's kernel has closed it by then; lbsgd's has not."""

import os
from pathlib import Path

import pytest

pytest.importorskip("ipykernel")
from jupyter_client.manager import KernelManager

PROBE = """
import sys, time
from ipykernel.ipkernel import IPythonKernel
from lbsgd.kernel import Kernel


def probe(base):
    class Probe(base):
        def _publish_status(self, status, channel, parent=None):
            if self._shutdown_message is not None and (channel, status) == ("control", "idle"):
                time.sleep(1.0)  # the control thread descheduled at the worst moment
                alive = self.iopub_thread.thread.is_alive()
                print(f"iopub alive at the last message: {alive}", file=sys.__stderr__, flush=True)
            super()._publish_status(status, channel, parent)
    return Probe


Stock, Ours = probe(IPythonKernel), probe(Kernel)
"""


def _shut_down(tmp_path: Path, kernel_class: str) -> tuple[int, str]:
    """A kernel of ``kernel_class`` started, one cell run, shut down politely: its exit code
    and what it printed on stderr."""
    (tmp_path / "probe_kernels.py").write_text(PROBE)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    km = KernelManager(kernel_name="python3")
    with open(tmp_path / "stderr.txt", "w") as err:
        km.start_kernel(
            extra_arguments=[f"--IPKernelApp.kernel_class=probe_kernels.{kernel_class}"],
            env={**os.environ, "PYTHONPATH": path},
            stderr=err,
        )
        process = km.provisioner.process
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=120)
            assert kc.execute_interactive("x = 1", timeout=60)["content"]["status"] == "ok"
        finally:
            kc.stop_channels()
        km.shutdown_kernel(now=False)
        code = process.wait(timeout=60)
    return code, (tmp_path / "stderr.txt").read_text()


@pytest.mark.slow
def test_the_kernel_keeps_iopub_open_until_the_shutdown_request_is_answered(tmp_path):
    code, err = _shut_down(tmp_path, "Ours")
    assert "iopub alive at the last message: True" in err, err
    assert code == 0 and "Aborted" not in err, err


@pytest.mark.slow
def test_ipykernels_own_kernel_closes_iopub_under_that_message(tmp_path):
    """The probe reaches the race (else the test above could not fail): ipykernel's own kernel
    has closed IOPub when its control thread sends the shutdown's last message. If a release of
    ipykernel closes the race itself, this fails and lbsgd.kernel can go."""
    _, err = _shut_down(tmp_path, "Stock")
    assert "iopub alive at the last message: False" in err, err


def test_make_setup_names_the_kernel_in_the_kernel_configuration():
    """tools/ipython_kernel_config.py, run as IPython runs it, sets lbsgd's kernel class."""
    from ipykernel.ipkernel import IPythonKernel
    from traitlets.config import Config
    from traitlets.utils.importstring import import_item

    config = Config()
    source = Path(__file__).resolve().parents[1] / "tools" / "ipython_kernel_config.py"
    exec(compile(source.read_text(), str(source), "exec"), {"get_config": lambda: config})
    assert config.IPKernelApp.kernel_class == "lbsgd.kernel.Kernel"
    assert issubclass(import_item(config.IPKernelApp.kernel_class), IPythonKernel)
