"""The CPU kernels' instruction set, capped so that CPU runs give the same digits on other machines.

The small nets of the cpu and smoke profiles are chaotic, so a kernel that rounds differently
changes every digit of a run. ATen (``ATEN_CPU_CAPABILITY``), oneDNN (``ONEDNN_MAX_CPU_ISA``) and
MKL (``MKL_CBWR``) each read their variable once, at their first use (not at ``import torch``), so
:func:`pin` must run before any tensor operation. The cap is the hardware key ``cpu_isa``
(:data:`CAPS`); ``portable`` (ATen at AVX2, oneDNN's convolutions off, MKL's COMPATIBLE branch) is
the one measured to give the same digits on Intel and AMD. docs/portability.md has the evidence."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

# the variables each cap sets, before torch is imported (lbsgd.cli) or before its first operation
CAPS: dict[str, dict[str, str]] = {
    "native": {},
    "portable": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_CBWR": "COMPATIBLE",
    },
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "AVX2"},
    "avx512_core": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_CBWR": "AVX512",
    },
    "avx512_core_amx": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX",
        "MKL_CBWR": "AVX512",
    },
}
# caps under which oneDNN's convolutions are off (torch.backends.mkldnn.enabled = False): its
# blocking follows the CPU's caches and vendor, which no ISA cap pins
NO_ONEDNN = frozenset({"portable"})
# every variable that caps a CPU library's instruction set (the ones a user may set by hand too)
VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
)
# /proc/cpuinfo flags a cap needs
NEEDS: dict[str, tuple[str, ...]] = {
    "portable": ("avx2", "fma"),
    "avx2": ("avx2", "fma"),
    "avx512_core": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "avx512_core_amx": ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "amx_tile"),
}
# oneDNN implementation suffixes by rank (same rank: oneDNN's aliases); a convolution's
# implementation must not rank above its cap
_ONEDNN_RANK = {
    "sse41": 0,
    "avx": 1,
    "avx2": 2,
    "avx2_vnni": 3,
    "avx2_vnni_2": 4,
    "avx512_core": 5,
    "avx512_core_vnni": 6,
    "avx512_core_bf16": 7,
    "avx512_core_fp16": 8,
    "avx10_1_512": 8,
    "avx512_core_amx": 9,
    "avx10_1_512_amx": 9,
    "avx512_core_amx_fp16": 10,
    "avx10_1_512_amx_fp16": 10,
    "avx10_2_512": 11,
    "avx10_2_512_amx_2": 12,
}
_PROBED: dict[str, Any] = {}  # probe()'s answers, once per process
# whether pin() ran before torch was imported (python -m lbsgd train): then every library reads
# the cap at its first use, by construction
_PINNED: dict[str, bool] = {}


def _cpuinfo(*fields: str) -> str | None:
    """The value of the first /proc/cpuinfo line that starts with one of ``fields`` (None where
    there is none: not Linux, or no such line)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(fields):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> list[str] | None:
    """The CPU's flags from /proc/cpuinfo (None where there is none: not Linux)."""
    flags = _cpuinfo("flags", "Features")
    return None if flags is None else flags.split()


def cpu_model() -> str:
    """/proc/cpuinfo's model name, else what the platform module knows."""
    model = _cpuinfo("model name")
    if model is not None:
        return model
    import platform

    return platform.processor() or platform.machine()


def cpu_vendor() -> str | None:
    """/proc/cpuinfo's vendor_id (GenuineIntel, AuthenticAMD, ...; None where there is none)."""
    return _cpuinfo("vendor_id")


def isa_flags() -> list[str] | None:
    """The flags that decide the kernels' code paths: avx*, amx*, fma, f16c."""
    flags = cpu_flags()
    if flags is None:
        return None
    return sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))


def requested(values: Mapping[str, Any]) -> str:
    """The cap a raw mapping of config keys asks for (not validated: "native" when it is not one
    of :data:`CAPS`, the config's own validation then names the bad value)."""
    isa = values.get("cpu_isa", "native")
    return isa if isa in CAPS else "native"


def pin(cpu_isa: str) -> dict[str, str]:
    """Set the variables of ``cpu_isa`` in this process's environment (children inherit them);
    returns the values they had before (None: unset). Effective only before torch's first CPU
    operation, hence before torch is imported by ``python -m lbsgd train`` (lbsgd.cli)."""
    before = {k: os.environ.get(k) for k in CAPS[cpu_isa]}
    os.environ.update(CAPS[cpu_isa])
    if CAPS[cpu_isa]:
        _PINNED.setdefault("before_torch", "torch" not in sys.modules)
    return before


def _restore(before: Mapping[str, str | None]) -> None:
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def _captured_stdout(lines: list[str]):
    """Append to ``lines`` what C code writes to file descriptor 1 inside the block (oneDNN's and
    MKL's verbose lines), at its exit."""
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as f:
        os.dup2(f.fileno(), 1)
        try:
            yield
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
            f.seek(0)
            lines.extend(f.read().decode(errors="replace").splitlines())


def probe(mkl: bool = False) -> dict[str, Any]:
    """What the CPU libraries use in this process, asked of each (and latched by asking): ATen's
    capability, the implementation oneDNN runs a float32 convolution with (and the maximum ISA
    its verbose header names, when this is the first verbose output of the process), and with
    ``mkl`` MKL's CNR branch for an SGEMM (its verbose mode takes 0.01-1 s to start: asked only
    where the cap was set after torch was imported). Once per process; None where not asked or
    where a library says nothing."""
    if _PROBED and (not mkl or _PROBED["mkl_cbwr"] is not None):
        return dict(_PROBED)
    import torch

    out: dict[str, Any] = {
        "aten": torch.backends.cpu.get_cpu_capability(),
        "onednn": None,
        "onednn_max": None,
        "mkl_cbwr": None,
        **_PROBED,
    }
    lines: list[str] = []  # the verbose lines of a float32 convolution and an SGEMM, as asked
    with contextlib.suppress(Exception), _captured_stdout(lines):
        if torch.backends.mkldnn.is_available() and out["onednn"] is None:
            # batch 2: ATen sends a batch of one to its own kernels, not to oneDNN
            x = torch.ones(2, 8, 8, 8).contiguous(memory_format=torch.channels_last)
            w = torch.ones(8, 8, 3, 3).contiguous(memory_format=torch.channels_last)
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                torch.nn.functional.conv2d(x, w)
        if mkl and torch.backends.mkl.is_available():
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    out.update(_from_verbose(lines))
    _PROBED.update(out)
    return dict(out)


def _from_verbose(lines: list[str]) -> dict[str, str]:
    """What oneDNN's and MKL's verbose lines say: oneDNN's maximum ISA and convolution
    implementation, MKL's CNR branch."""
    out = {}
    for line in lines:
        if line.startswith("onednn_verbose") and ",info,cpu,isa:" in line:
            out["onednn_max"] = line.split(",info,cpu,isa:", 1)[1].strip()
        elif line.startswith("onednn_verbose") and ",exec,cpu,convolution," in line:
            impl = line.split(",exec,cpu,convolution,", 1)[1].split(",", 1)[0]
            out["onednn"] = impl.rpartition(":")[2] or impl
        elif line.startswith("MKL_VERBOSE") and (m := re.search(r"\bCNR:(\S+)", line)):
            out["mkl_cbwr"] = m.group(1)
    return out


def mkl_branch(cpu_isa: str, vendor: str | None) -> str | None:
    """The CNR branch MKL runs under ``cpu_isa`` on a CPU of ``vendor`` (/proc/cpuinfo's vendor_id;
    None: unknown, not judged): MKL honours ``MKL_CBWR=COMPATIBLE`` on every x86 CPU, and a branch
    named by instruction set (AVX2, AVX512) only on Intel's; elsewhere it stays on its automatic
    choice (measured on an AMD EPYC: ``CNR:AUTO`` for ``MKL_CBWR=AVX2``)."""
    want = CAPS[cpu_isa].get("MKL_CBWR")
    if want is None or want == "COMPATIBLE":
        return want
    if vendor is None:
        return None
    return want if vendor == "GenuineIntel" else "AUTO"


def problems(
    cpu_isa: str,
    probed: Mapping[str, Any],
    flags: list[str] | None,
    vendor: str | None = None,
) -> list[str]:
    """Why the kernels of this process do not run at ``cpu_isa`` (empty: they do, as far as each
    library says and as far as ``vendor``'s CPUs let it, :func:`mkl_branch`). ``probed``:
    :func:`probe`'s answer (a library left out or None: not judged); ``flags``: :func:`cpu_flags`'
    (None: not judged)."""
    if cpu_isa == "native":
        return []
    out = []
    if flags is not None:
        lacking = [f for f in NEEDS[cpu_isa] if f not in flags]
        if lacking:
            return [f"this CPU lacks {', '.join(lacking)}"]
    aten = CAPS[cpu_isa]["ATEN_CPU_CAPABILITY"].upper()  # as get_cpu_capability() spells it
    if probed.get("aten") not in (None, aten):
        out.append(f"ATen's kernels use {probed.get('aten')}, not {aten}")
    out += _onednn_problems(cpu_isa, probed.get("onednn"))
    mkl, want = probed.get("mkl_cbwr"), mkl_branch(cpu_isa, vendor)
    if mkl is not None and want is not None and mkl != want:
        out.append(f"MKL's branch is CNR:{mkl}, not {want}")
    return out


def _onednn_problems(cpu_isa: str, onednn: str | None) -> list[str]:
    """Why oneDNN's convolutions (``onednn``: the implementation it ran; None: not judged) do not
    follow ``cpu_isa``: they run where ATen's should, or at a wider ISA."""
    if onednn is None:
        return []
    if cpu_isa in NO_ONEDNN:
        return [f"oneDNN's convolutions run ({onednn}), not ATen's"]
    rank = _ONEDNN_RANK.get(str(onednn))
    return (
        [f"oneDNN's convolutions use {onednn}"]
        if rank is not None and rank > _ONEDNN_RANK[cpu_isa]
        else []
    )


def require(cpu_isa: str) -> None:
    """Make sure this process's CPU kernels run at ``cpu_isa`` before a run starts: pin its
    variables, ask each library what it uses, and refuse (one-line ConfigError, the environment
    as it was) when one of them does not follow the cap.

    Why refuse rather than train and record what took effect: the cap is read once per process at
    each library's first use, so a process that has already run torch operations (a test session,
    a notebook that trained before) keeps its native kernels whatever is set now. A run made there
    would carry ``cpu_isa=avx2`` in its config.yaml and digits no AVX2 machine gives again: a record
    that says what did not happen. A process where nothing has run yet (``python -m lbsgd train``,
    torchrun's workers, a fresh kernel) takes the cap here and is held to it until it exits (the
    variables stay set, so that spawned loader workers follow it too).
    """
    if cpu_isa == "native":
        return
    flags, vendor = cpu_flags(), cpu_vendor()
    wrong = problems(cpu_isa, {}, flags)  # a CPU without the ISA: nothing set, nothing asked
    if not wrong:
        pinned_before = dict(_PINNED)
        before = pin(cpu_isa)
        import torch

        onednn_before = torch.backends.mkldnn.enabled
        if cpu_isa in NO_ONEDNN:  # a runtime switch: ATen's own convolutions from here on
            torch.backends.mkldnn.enabled = False
        # one library at a time: a refusal leaves the libraries not asked yet uncapped. MKL is
        # asked in every process, pinned before torch or not: on a non-Intel CPU it does not
        # follow every branch it is given (mkl_branch), and both paths must say so alike
        asks = [
            lambda: {"aten": torch.backends.cpu.get_cpu_capability()},
            probe,
            lambda: probe(mkl=True),
        ]
        for ask in asks:
            wrong = problems(cpu_isa, ask(), flags, vendor)
            if wrong:  # this process as it was
                _restore(before)
                _PINNED.clear()
                _PINNED.update(pinned_before)
                torch.backends.mkldnn.enabled = onednn_before
                break
    if wrong:
        from lbsgd.config import ConfigError

        if wrong[0].startswith("this CPU lacks"):
            raise ConfigError(f"cpu_isa={cpu_isa}: {wrong[0]}; use a lower cap or cpu_isa=native")
        shown = " ".join(f"{k}={v}" for k, v in CAPS[cpu_isa].items())
        raise ConfigError(
            f"cpu_isa={cpu_isa} cannot take effect in this process: {'; '.join(wrong)} (each "
            f"library reads its cap once, at its first use); train with `python -m lbsgd train`, "
            f"or start Python with {shown}, or use cpu_isa=native"
        )


def in_force(cpu_isa: str | None = None) -> dict[str, Any]:
    """The environment record of the caps: the one asked for, the variables set, whether lbsgd
    set them before torch was imported (None: it set none), what each library uses
    (:func:`probe`; MKL's branch under a cap), whether oneDNN's convolutions are on, the CPU's
    vendor, and whether that is the cap on this vendor (absent when none was asked for)."""
    import torch

    # MKL's branch is asked where a cap is judged (its verbose mode takes ~0.4 s to start: not
    # paid by every uncapped run); require() has asked it already in a capped process
    probed = probe(mkl=cpu_isa not in (None, "native"))
    vendor = cpu_vendor()
    record: dict[str, Any] = {
        "requested": cpu_isa,
        "variables": {k: os.environ[k] for k in VARIABLES if k in os.environ},
        "pinned_before_torch": _PINNED.get("before_torch"),
        "onednn_convolutions": bool(torch.backends.mkldnn.enabled),
        "cpu_vendor": vendor,
        **probed,
    }
    if cpu_isa is not None:
        record["in_effect"] = not problems(cpu_isa, probed, cpu_flags(), vendor)
    return record
