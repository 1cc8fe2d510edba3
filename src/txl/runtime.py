"""Where and how computations run: the device, the autocast dtype, seeding and the cache folder.

Every command and library function that needs one of these takes it from here, so that the
analysis tools and commands take them from one place.
"""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import numpy as np
import torch

from txl.errors import TxlError

DTYPES = ("float32", "bfloat16", "float16")


def resolve_device(name: str) -> torch.device:
    """``"auto"`` → cuda when available, else cpu; otherwise the named device.

    Raises:
        TxlError: an unknown device name or an unavailable CUDA device.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise TxlError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise TxlError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return device


def autocast(device: torch.device, dtype: str):
    """Autocast context for ``"bfloat16"``/``"float16"`` on ``device``; a no-op for ``"float32"``.
    ``dtype`` may also be the torch dtype itself (``torch.bfloat16``).

    Raises:
        TxlError: a dtype other than those in :data:`DTYPES`.
    """
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise TxlError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


# CPU feature flags (Linux /proc/cpuinfo) that mean native arithmetic in a half-precision type: x86
# AVX512-BF16/AMX-BF16 and AVX512-FP16/AMX-FP16, Arm BF16 and half-precision SIMD
_NATIVE_CPU_FLAGS = {"bfloat16": {"avx512_bf16", "amx_bf16", "bf16"},
                     "float16": {"avx512fp16", "avx512_fp16", "amx_fp16", "asimdhp", "fphp"}}


def cpu_flags() -> set[str] | None:
    """The feature flags of this CPU from ``/proc/cpuinfo`` (x86 ``flags``, Arm ``Features``); None where
    the system does not say (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def native_dtype_support(device: torch.device, dtype: str) -> bool:
    """Whether ``device`` computes in ``dtype`` natively rather than emulating it (many times slower).

    float32 and CUDA devices are taken as native. On a CPU, bfloat16 needs AVX512-BF16 or AMX (x86)
    or the BF16 extension (Arm), float16 AVX512-FP16/AMX-FP16 or Arm half-precision SIMD, as listed
    by :func:`cpu_flags`; where the flags cannot be read, True (no false alarm).
    """
    if dtype == "float32" or device.type != "cpu" or dtype not in _NATIVE_CPU_FLAGS:
        return True
    flags = cpu_flags()
    if flags is None:
        return True
    return bool(flags & _NATIVE_CPU_FLAGS[dtype])


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's (all devices) random number generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def memory_bytes() -> int:
    """This machine's physical memory in bytes (a very large number where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def available_memory_bytes() -> int:
    """Memory available to new allocations of this process in bytes: the least of ``MemAvailable``
    (/proc/meminfo), the room left under a cgroup memory limit (a container's; v2 or v1) and under
    an address-space limit (``ulimit -v``), where each exists; the physical memory
    (:func:`memory_bytes`) where none does."""
    figures = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            figures += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = Path(limit).read_text(encoding="ascii").strip()
            if cap != "max" and int(cap) < 1 << 60:
                figures.append(max(0, int(cap) - int(Path(usage).read_text(encoding="ascii"))))
        except (OSError, ValueError):
            pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            pages = int(Path("/proc/self/statm").read_text(encoding="ascii").split()[0])
            figures.append(max(0, soft - pages * os.sysconf("SC_PAGE_SIZE")))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(figures) if figures else memory_bytes()


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation failure: MemoryError, torch's out-of-memory errors, or the CPU
    allocator's RuntimeError ("can't allocate memory")."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(err, RuntimeError) and ("can't allocate memory" in str(err) or "out of memory" in str(err))


def format_bytes(n: int) -> str:
    """A byte count for people, one decimal: GiB from 1 GiB on, MiB from 1 MiB on, else KiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KiB"


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/txl`` or ``~/.cache/txl``: where encoded corpora are cached."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "txl")
