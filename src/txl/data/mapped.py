"""Token arrays that may be memory-mapped: read them in bounded pieces and keep resident memory flat.

A split of a corpus larger than memory is a ``np.memmap`` of the token cache. Reading it touches its
pages, and the pages a process has touched count in its resident memory until the kernel needs them
back, so a pass over a 4 GB split would show 4 GB of RSS although nothing was copied. The readers that
pass over a split (training and evaluation through :class:`~txl.data.iterators.LMOrderedIterator`, the
sliding window, the range check below) read through :class:`PageBudget`, which hands the pages of a
read-only mapping back to the page cache (``madvise(MADV_DONTNEED)``: the file's pages stay cached, the
next read maps them again without touching the disk) each time ``RELEASE_BYTES`` have been
read. Arrays in memory (numpy, lists, tensors) are read as they are.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

from txl.config import check_count
from txl.errors import TxlError

RELEASE_BYTES = 64 << 20
"""Bytes of a memory-mapped array read between two releases of its pages."""

CHUNK_TOKENS = 16 << 20
"""Tokens read at a time by :func:`token_range` (and by a caller that compares two arrays piece by piece)."""


class PageBudget:
    """Counts the bytes read from one array and releases the mapped pages every ``RELEASE_BYTES``.

    Args:
        tokens: the array being read; only a ``np.memmap`` (or a view of one) has pages to release.
        release_bytes: bytes read between two releases.
    """

    def __init__(self, tokens, release_bytes: int = RELEASE_BYTES) -> None:
        # read-only mappings only: the pages of a copy-on-write one ("c") hold its changes, which a release drops
        readonly = isinstance(tokens, np.memmap) and getattr(tokens, "mode", None) == "r"
        self._mmap = getattr(tokens, "_mmap", None) if readonly else None
        self._itemsize = getattr(tokens, "itemsize", 8)
        self.release_bytes = release_bytes
        self._read = 0
        self.releases = 0

    def read(self, n_tokens: int) -> None:
        """Count ``n_tokens`` tokens just read; release the pages once enough have been."""
        if self._mmap is None:
            return
        self._read += n_tokens * self._itemsize
        if self._read >= self.release_bytes:
            self.release()

    def release(self) -> None:
        """Drop the mapping's resident pages now (they stay in the page cache)."""
        if self._mmap is not None and not self._mmap.closed and hasattr(self._mmap, "madvise"):
            self._mmap.madvise(mmap.MADV_DONTNEED)
            self.releases += 1
        self._read = 0


def token_array(tokens, *, vocab_size: int | None = None, min_tokens: int = 2, max_tokens: int = 0) -> np.ndarray:
    """``tokens`` as a 1-D integer numpy array, without a copy where it already is one (a memory-mapped split
    stays on disk).

    Args:
        tokens: a 1-D sequence of integer ids (list, numpy array, ``np.memmap`` or tensor).
        vocab_size: when given, every id must lie in ``[0, vocab_size)`` (checked in pieces of ``CHUNK_TOKENS``).
        min_tokens: the fewest tokens accepted (2: one input and one target).
        max_tokens: keep ``max_tokens + 1`` tokens (0: all).

    Raises:
        TxlError: ``tokens`` that is not 1-D integer data (floats are refused, not truncated), an id outside
            the vocabulary, or fewer than ``min_tokens`` tokens.
    """
    check_count(max_tokens, "max_tokens")
    if isinstance(tokens, torch.Tensor):
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TxlError(f"tokens must be a 1-D sequence of integer token ids, got dtype {tokens.dtype}")
        if tokens.layout != torch.strided or tokens.is_meta:
            raise TxlError(f"tokens must be a dense tensor with values, got layout {tokens.layout} on {tokens.device}")
        tokens = tokens.detach().cpu().numpy()
    try:
        arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    except (ValueError, TypeError) as e:  # ragged nested lists
        raise TxlError(f"tokens must be a 1-D sequence of integer token ids: {e}") from None
    if arr.ndim != 1 or not (arr.dtype.kind in "iu" or (arr.size == 0 and arr.dtype.kind == "f")):
        raise TxlError(f"tokens must be a 1-D sequence of integer token ids, got shape {arr.shape} dtype {arr.dtype}")
    if max_tokens:
        arr = arr[: max_tokens + 1]
    if arr.size < min_tokens:
        raise TxlError(f"the text has fewer than {min_tokens} tokens: nothing to score")
    lo, hi = token_range(arr) if arr.size and (vocab_size is not None or arr.dtype == np.uint64) else (0, 0)
    if hi > np.iinfo(np.int64).max:
        raise TxlError(f"tokens: token id {hi} is larger than an int64 id can be")
    if vocab_size is not None and arr.size:
        if lo < 0 or hi >= vocab_size:
            raise TxlError(f"tokens: token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab_size})")
    return arr if arr.size else arr.astype(np.int64)


def token_range(arr: np.ndarray) -> tuple[int, int]:
    """The smallest and largest id of a non-empty 1-D integer array, read ``CHUNK_TOKENS`` at a time."""
    budget = PageBudget(arr)
    lo, hi = None, None
    for start in range(0, arr.size, CHUNK_TOKENS):
        piece = arr[start:start + CHUNK_TOKENS]
        a, b = int(piece.min()), int(piece.max())
        lo, hi = a if lo is None else min(lo, a), b if hi is None else max(hi, b)
        budget.read(piece.size)
    budget.release()
    return lo, hi

