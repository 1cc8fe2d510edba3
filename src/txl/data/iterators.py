"""Segment iterators for Transformer-XL training and evaluation (batch-first).

:class:`LMOrderedIterator`: the token stream is cut into ``batch_size`` contiguous parallel
streams that are read left to right in segments, so each segment continues the previous one and
the model's memory carries over. Unlike the reference implementation, no target is dropped: every
target of the split is scored exactly once per pass (the tail is padded with ``pad_id`` inputs
and ``-100`` labels).

:class:`LMShuffledIterator`: independent sentences (lm1b) in a random order per pass, packed one
after another into ``batch_size`` streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from txl.config import IGNORE_INDEX, check_count
from txl.data.mapped import PageBudget, token_array
from txl.errors import TxlError, counted


class EpochOrder:
    """Items ``0 .. n-1`` read in seeded shuffled epochs: epoch e is ``randperm(n)`` drawn from a
    generator seeded ``seed + e``, so the item at any position of the stream is known without saved
    RNG state (a resumed run reads exactly what it would have read).

    Raises:
        TxlError: ``n`` < 1.
    """

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise TxlError(f"nothing to read: {n} items")
        self.n, self.seed = n, seed
        self._epoch: tuple[int, list[int]] | None = None

    def epoch(self, e: int) -> list[int]:
        """The items of epoch ``e`` in the order they are read."""
        if self._epoch is None or self._epoch[0] != e:
            self._epoch = (e, torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + e)).tolist())
        return self._epoch[1]

    def take(self, position: int, count: int) -> list[int]:
        """The ``count`` items read from stream position ``position`` on."""
        return [self.epoch(i // self.n)[i % self.n] for i in range(position, position + count)]


class EpochBatches:
    """``batch_size`` of ``n`` items per step in seeded shuffled epochs (:class:`EpochOrder`); the position
    counts items taken, so a resumed run continues with exactly the items it would have read.
    ``make(indices)`` builds the ``(x, y)`` batch of the chosen items.

    Raises:
        TxlError: ``n`` < 1.
    """

    def __init__(self, n: int, batch_size: int, seed: int, make: Callable[[list[int]], tuple]) -> None:
        self.order, self.batch_size, self.make = EpochOrder(n, seed), batch_size, make

    def next(self, position: int, tgt_len: int, generator: torch.Generator):
        return (*self.make(self.order.take(position, self.batch_size)), position + self.batch_size, True)


def to_device(batch: torch.Tensor, device) -> torch.Tensor:
    """A host batch on ``device``: for a CUDA device copied from pinned memory without waiting
    (``non_blocking``: the copy overlaps the work queued before it; the pinned block is kept until the
    copy is done); elsewhere an ordinary ``.to``."""
    if torch.device(device).type == "cuda" and batch.device.type == "cpu":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)

__all__ = ["LMOrderedIterator", "LMShuffledIterator", "IGNORE_INDEX", "longest_segment", "sample_segment_length"]

"""Label value of positions that are not scored (context and padding); ``cross_entropy``'s default."""


def sample_segment_length(
    tgt_len: int,
    generator: torch.Generator | None = None,
    *,
    std: float = 5,
    min_len: int = 5,
    max_deviation: float = 3,
) -> int:
    """A random segment length (tokens), as the reference ``get_varlen_iter`` draws it (``train.varlen``).

    bptt is ``tgt_len`` with probability 0.95, else ``tgt_len / 2``; the result is
    ``int(normal(bptt, std))`` clipped to ``[min_len, int(tgt_len + max_deviation * std)]`` (and
    at least 1). Draws come from ``generator`` (CPU; seed it for determinism).
    Raises ``ValueError`` if ``tgt_len < 1`` or ``min_len < 1``.
    """
    if tgt_len < 1 or min_len < 1:
        raise TxlError(f"tgt_len and min_len must be at least 1, got {tgt_len} and {min_len}")
    u = torch.rand((), generator=generator).item()
    bptt = tgt_len if u < 0.95 else tgt_len / 2.0
    draw = bptt + std * torch.randn((), generator=generator).item()
    return max(1, min(longest_segment(tgt_len, std=std, max_deviation=max_deviation), max(min_len, int(draw))))


def longest_segment(tgt_len: int, *, std: float = 5, max_deviation: float = 3) -> int:
    """The longest segment :func:`sample_segment_length` draws for ``tgt_len`` (same keywords)."""
    return max(1, int(tgt_len + max_deviation * std))


def _check_shape(batch_size: int, tgt_len: int) -> None:
    """Raise :class:`TxlError` unless ``batch_size`` and ``tgt_len`` are integers of at least 1."""
    check_count(batch_size, "batch_size", 1)
    check_count(tgt_len, "tgt_len", 1)


class LMOrderedIterator:
    """Batch-first ordered segments over a 1-D token array.

    With N tokens and W = ``context`` leading context tokens, the scored targets are the tokens
    at indices ``W+1 .. N-1`` (n = N-1-W of them; the target of position t is token t+1).
    L = ceil(n / batch_size); stream b starts at s_b = W + b*L, its inputs are
    ``tokens[s_b-W : s_b+L]`` and its labels ``tokens[s_b-W+1 : s_b+L+1]``, with the first W
    labels set to -100 (context only) and positions past the data padded (input ``pad_id``,
    label -100). Labels are already aligned with inputs: no further shift is needed.

    The token array is kept as it is given (a memory-mapped array of a corpus larger than memory
    stays on disk): a segment reads only its own ``B x T`` tokens and turns them into int64.

    Args:
        tokens: 1-D integer array (numpy, possibly a ``np.memmap``) or tensor, shape ``[N]``.
        batch_size: number of parallel streams B (>= 1).
        tgt_len: segment length of :meth:`__iter__` (>= 1).
        context: W, number of leading tokens used only as context (>= 0).
        device: device of the segments.
        pad_id: input id used for padding past the end of the data.

    Attributes:
        stream_len: W + L. n_targets: number of scored labels (n). (The whole streams are
            ``segment(0, stream_len)``; readers of a split take :meth:`streams`.)

    Raises:
        TxlError: bad ``batch_size`` / ``tgt_len`` / ``context``, fewer than W+2 tokens, or
            ``tokens`` that is not 1-D integer data.
    """

    def __init__(
        self,
        tokens: np.ndarray | torch.Tensor,
        batch_size: int,
        tgt_len: int,
        *,
        context: int = 0,
        device: str | torch.device = "cpu",
        pad_id: int = 0,
    ) -> None:
        _check_shape(batch_size, tgt_len)
        if context < 0:
            raise TxlError(f"context must be non-negative, got {context}")
        self.tokens = token_array(tokens, min_tokens=0)
        n_tok = len(self.tokens)
        n = n_tok - 1 - context
        if n < 1:
            raise TxlError(
                f"the text has {counted(n_tok, 'token')}, fewer than the {context + 2} needed for {context} context "
                f"token(s), then one input and its target; use more data or less context"
            )
        self.batch_size = batch_size
        self.tgt_len = tgt_len
        self.context = context
        self.device = torch.device(device)
        self.pad_id = pad_id
        self.n_tokens = n_tok
        self.n_targets = n
        self.stride = math.ceil(n / batch_size)  # L: stream b reads tokens from b * L on
        self.stream_len = context + self.stride
        self._pages = PageBudget(self.tokens)
        self._last_read = None  # (streams, start, stop, inputs, labels): StreamColumns' last block

    def _rows(self, pos: int, end: int, streams: range | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Host int64 inputs and labels [len(streams), end - pos] of stream positions ``[pos, end)`` (all
        streams by default): each stream's ``end - pos + 1`` tokens read as one slice (inputs, then their
        targets one further on)."""
        streams = range(self.batch_size) if streams is None else streams
        width = end - pos
        x = np.full((len(streams), width), self.pad_id, dtype=np.int64)
        y = np.full((len(streams), width), IGNORE_INDEX, dtype=np.int64)
        for i, b in enumerate(streams):
            start = b * self.stride + pos
            read = self.tokens[start:start + width + 1]
            x[i, : min(len(read), width)] = read[:width]
            y[i, : max(len(read) - 1, 0)] = read[1:]
            self._pages.read(len(read))
        if pos < self.context:  # the context's labels are not scored
            y[:, : self.context - pos] = IGNORE_INDEX
        return x, y

    def segment(self, pos: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels at stream positions ``[pos, pos + seq_len)``, truncated at the end.

        Returns two contiguous ``int64`` tensors of shape ``[B, min(seq_len, stream_len - pos)]``.
        Raises ``ValueError`` if ``pos`` is outside ``[0, stream_len)`` or ``seq_len < 1``.
        """
        if not 0 <= pos < self.stream_len:
            raise TxlError(f"segment position {pos} is outside [0, {self.stream_len})")
        if seq_len < 1:
            raise TxlError(f"segment length must be at least 1, got {seq_len}")
        end = min(pos + seq_len, self.stream_len)
        x, y = self._rows(pos, end)
        return to_device(torch.from_numpy(x), self.device), to_device(torch.from_numpy(y), self.device)

    def streams(self, rows: slice = slice(None)) -> tuple["StreamColumns", "StreamColumns"]:
        """The inputs and labels of streams ``rows`` (a slice of unit step) as two lazy [b, W + L] arrays for
        :func:`txl.segments.segments`: indexing ``[rows, columns]`` reads only those columns'
        tokens (a memory-mapped split stays on disk; resident memory does not grow with it).

        Raises:
            TxlError: ``rows`` that is not a slice of unit step.
        """
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise TxlError(f"streams() takes a slice of streams (e.g. slice(0, 4)), got {rows!r}")
        picked = range(self.batch_size)[rows]
        return StreamColumns(self, picked, labels=False), StreamColumns(self, picked, labels=True)

    def _context_positions(self) -> list[tuple[int, int]]:
        """(pos, seq_len) chunks of at most tgt_len covering exactly the context [0, W)."""
        return [(p, min(self.tgt_len, self.context - p)) for p in range(0, self.context, self.tgt_len)]

    def positions(self) -> list[tuple[int, int]]:
        """The ``(pos, seq_len)`` of every segment :meth:`__iter__` yields, in order."""
        scored = [
            (p, min(self.tgt_len, self.stream_len - p))
            for p in range(self.context, self.stream_len, self.tgt_len)
        ]
        return self._context_positions() + scored

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(x, y)`` segments, each ``[B, seq_len]`` int64 (seq_len <= tgt_len).

        The context [0, W) comes first in chunks of ``tgt_len`` (all labels -100), so that a
        segment boundary falls exactly at W; then scored segments of ``tgt_len`` from W, the last
        one possibly shorter.
        """
        for pos, seq_len in self.positions():
            yield self.segment(pos, seq_len)

    def __len__(self) -> int:
        """Number of segments :meth:`__iter__` yields."""
        return math.ceil(self.context / self.tgt_len) + math.ceil(
            (self.stream_len - self.context) / self.tgt_len
        )

    def __repr__(self) -> str:
        return (
            f"LMOrderedIterator(n_tokens={self.n_tokens}, batch_size={self.batch_size}, "
            f"tgt_len={self.tgt_len}, context={self.context}, stream_len={self.stream_len}, "
            f"segments={len(self)})"
        )


class StreamColumns:
    """The inputs (or labels) of some streams of an :class:`LMOrderedIterator`, read on demand.

    Looks like an int64 [b, W + L] tensor to :func:`txl.segments.segments`: ``shape``, ``device``,
    ``dim()`` and ``x[rows, columns]`` (``rows``: ``slice(None)`` or an int64 index tensor into the b
    streams; ``columns``: a slice of unit step), which returns those columns as a tensor on ``device``.
    Columns are read ahead in blocks of about ``BLOCK_BYTES`` (inputs and labels together, one upload
    each per block, not per segment); the last block is kept.
    """

    BLOCK_BYTES = 32 << 20

    def __init__(self, batches: LMOrderedIterator, streams: range, *, labels: bool) -> None:
        self.batches, self.rows, self.is_labels = batches, streams, labels
        self.shape = torch.Size((len(streams), batches.stream_len))
        self.device = batches.device
        self.dtype = torch.int64

    def dim(self) -> int:
        return 2

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __getitem__(self, key) -> torch.Tensor:
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], slice)):
            raise TxlError(f"stream columns are read as [rows, start:stop], got {key!r}")
        pick, cols = key
        start, stop, step = cols.indices(self.shape[1])
        if step != 1:
            raise TxlError("stream columns are read as a contiguous range")
        stop = max(start, stop)
        cached = self.batches._last_read
        if cached is None or cached[0] != self.rows or not cached[1] <= start <= stop <= cached[2]:
            width = max(stop - start, self.BLOCK_BYTES // (16 * max(len(self.rows), 1)))
            end = min(start + width, self.shape[1])
            x, y = self.batches._rows(start, end, self.rows)
            cached = (self.rows, start, end, to_device(torch.from_numpy(x), self.device),
                      to_device(torch.from_numpy(y), self.device))
            self.batches._last_read = cached
        out = cached[4 if self.is_labels else 3][:, start - cached[1]:stop - cached[1]]
        return out if isinstance(pick, slice) and pick == slice(None) else out[pick]


class LMShuffledIterator:
    """Batch-first segments over shuffled independent sentences (the reference's lm1b iterator).

    Each pass visits every sentence once, in an order drawn from a ``torch.Generator`` seeded
    with ``seed`` (each pass draws a new order; the sequence of passes is reproducible). A
    sentence ``s`` becomes the unit ``[eos] + s + [eos]`` (``eos`` added at the end only if ``s``
    does not already end with it): its inputs are ``unit[:-1]`` and its labels ``unit[1:]``, so
    every token of the sentence and its final ``<eos>`` are scored, and the leading ``<eos>`` is
    context only (the reference's ``add_double_eos``). Units are packed back to back into
    ``batch_size`` streams, filling stream 0 of a batch, then stream 1, ...; a stream continues
    across batches, so the model's memory carries over, and a new sentence starts only after the
    previous one's ``<eos>``. When the sentences run out, the remaining positions get input
    ``pad_id`` and label -100; iteration stops after the last batch that holds any label (unlike
    the reference, which drops the incomplete last batch).

    Args:
        sentences: 1-D integer arrays/tensors/lists, one per sentence (shape ``[len]``; empty
            sentences are allowed and score one ``<eos>``).
        batch_size: number of parallel streams B (>= 1).
        tgt_len: segment length T (>= 1).
        eos_id: id of ``<eos>``.
        seed: seed of the shuffling generator. shuffle: False keeps the given order.
        device: device of the yielded tensors. pad_id: input id of empty positions.

    Raises:
        TxlError: bad ``batch_size`` / ``tgt_len``, or no sentences.
        TxlError: a sentence is not 1-D integer data.
    """

    def __init__(
        self,
        sentences: Sequence[np.ndarray | torch.Tensor | Sequence[int]],
        batch_size: int,
        tgt_len: int,
        *,
        eos_id: int,
        seed: int = 0,
        shuffle: bool = True,
        device: str | torch.device = "cpu",
        pad_id: int = 0,
    ) -> None:
        _check_shape(batch_size, tgt_len)
        if len(sentences) == 0:
            raise TxlError("the shuffled iterator needs at least one sentence")
        units = []
        for s in sentences:
            arr = token_array(s, min_tokens=0).astype(np.int64)
            if arr.size == 0 or arr[-1] != eos_id:
                arr = np.append(arr, eos_id)
            units.append(np.concatenate(([eos_id], arr)).astype(np.int64))
        self.units = units
        self.batch_size = batch_size
        self.tgt_len = tgt_len
        self.eos_id = eos_id
        self.shuffle = shuffle
        self.device = torch.device(device)
        self.pad_id = pad_id
        self.n_targets = sum(len(u) - 1 for u in units)
        self._generator = torch.Generator().manual_seed(seed)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.units)))
        return torch.randperm(len(self.units), generator=self._generator).tolist()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield ``(x, y)``: ``int64`` tensors of shape ``[B, tgt_len]``; y is aligned with x."""
        order = iter(self._order())
        B, T = self.batch_size, self.tgt_len
        current: list[np.ndarray | None] = [None] * B  # per stream: the unit being read
        offset = [0] * B  # per stream: next input position in its unit
        exhausted = False
        while True:
            x = np.full((B, T), self.pad_id, dtype=np.int64)
            y = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
            any_label = False
            for b in range(B):
                filled = 0
                while filled < T:
                    unit = current[b]
                    if unit is None or offset[b] >= len(unit) - 1:
                        nxt = None if exhausted else next(order, None)
                        if nxt is None:
                            exhausted = True
                            current[b] = None
                            break
                        unit, current[b], offset[b] = self.units[nxt], self.units[nxt], 0
                    n = min(len(unit) - 1 - offset[b], T - filled)
                    x[b, filled:filled + n] = unit[offset[b]:offset[b] + n]
                    y[b, filled:filled + n] = unit[offset[b] + 1:offset[b] + 1 + n]
                    offset[b] += n
                    filled += n
                    any_label = True
            if not any_label:
                return
            yield to_device(torch.from_numpy(x), self.device), to_device(torch.from_numpy(y), self.device)

    def __repr__(self) -> str:
        return (
            f"LMShuffledIterator(sentences={len(self.units)}, n_targets={self.n_targets}, "
            f"batch_size={self.batch_size}, tgt_len={self.tgt_len}, shuffle={self.shuffle})"
        )
