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

    Raises:
        TxlError: a dtype other than those in :data:`DTYPES`.
    """
    if dtype not in DTYPES:
        raise TxlError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


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


def default_cache_dir() -> str:
    """``$XDG_CACHE_HOME/txl`` or ``~/.cache/txl``: where encoded corpora are cached."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "txl")
