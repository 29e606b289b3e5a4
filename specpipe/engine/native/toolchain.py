"""The packed GEMM kernel's build: packed_gemm.c compiled for this CPU (cc -O3 -march=native, OpenMP where
the compiler has it) the first time it is needed, and cached in the first writable of $SPECPIPE_KERNELS,
$SPECPIPE_HOME/kernels and ~/.cache/specpipe/kernels under a key of the source, the compiler and the CPU
(a models volume is often mounted read-only; the kernel is built where it runs)."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

from specpipe.config.env import environment
from specpipe.core.errors import FailedPrecondition

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("packed_gemm.c")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-pthread")


def _cpu_fingerprint() -> str:
    """What -march=native compiles for: the CPU model and its feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keys = ("model name", "flags", "Features", "CPU part")
    return platform.machine() + "".join(sorted({line for line in lines if line.split(":")[0].strip() in keys}))


def _find_compiler() -> str | None:
    cc = os.environ.get("CC")
    return shutil.which(cc) if cc else shutil.which("cc") or shutil.which("gcc")


def has_compiler() -> bool:
    """Whether a C compiler is there to build the kernel."""
    return _find_compiler() is not None


def kernel_dirs() -> list[Path]:
    """Where the built kernel may be cached, first choice first."""
    env = environment()
    return [env.kernels] if env.kernels else [env.home / "kernels", Path.home() / ".cache" / "specpipe" / "kernels"]


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK | os.X_OK)


def unavailable() -> str | None:
    """None if the kernel can be built and cached here (what `--compile auto` asks); otherwise why not."""
    if not has_compiler():
        return "no C compiler (install gcc, or set CC)"
    if not any(_writable(d) for d in kernel_dirs()):
        return f"no writable directory for the kernel ({', '.join(map(str, kernel_dirs()))}; set SPECPIPE_KERNELS)"
    return None


def _compiler() -> str:
    cc = _find_compiler()
    if not cc:
        raise FailedPrecondition("--compile on builds a small C kernel for this CPU and needs a C compiler: "
                                 f"install gcc, or set CC (CC={os.environ.get('CC', '')!r})")
    return cc


def build(cc: str | None = None) -> Path:
    """The kernel library for this CPU, compiled now unless a cached build exists."""
    cc = cc or _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), cc, version, *FLAGS, _cpu_fingerprint()]).encode())
    name = f"packed_gemm-{key.hexdigest()[:16]}.so"
    cached = next((d / name for d in kernel_dirs() if (d / name).exists()), None)
    if cached is not None:
        return cached
    directory = next((d for d in kernel_dirs() if _writable(d)), None)
    if directory is None:
        raise FailedPrecondition(f"--compile on caches the packed GEMM kernel it builds, and no directory is "
                                 f"writable ({', '.join(map(str, kernel_dirs()))}): set SPECPIPE_KERNELS to one")
    target = directory / name
    partial = target.with_suffix(f".{os.getpid()}.partial")
    proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise FailedPrecondition(f"building the packed GEMM kernel failed ({cc}): {proc.stderr.strip()[-2000:]}")
    os.replace(partial, target)  # atomic: a concurrent build of the same key writes the same bytes
    log.info("built the packed GEMM kernel", extra={"path": str(target)})
    return target
