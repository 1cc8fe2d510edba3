"""Segment-level recurrence: checking and updating the per-layer memory (paper §3.2).

The memory of layer n is the *input* to layer n (layer 0: the embedding output) for the most recent
positions, detached from the graph. It is passed in and returned explicitly; no module keeps it.
"""

from __future__ import annotations

import contextlib

import torch

from txl.errors import TxlError

Mems = list[torch.Tensor]


def check_mems(mems: Mems | None, n_layer: int, batch_size: int, d_model: int, *,
               dtypes: tuple[torch.dtype, ...] | None = None, device: torch.device | None = None) -> int:
    """Check a memory against the input and return its length M (0 for None).

    Only shapes, dtypes and devices are read (no values), so the check never waits for a GPU.

    Args:
        mems: ``n_layer`` tensors, each [B, M, d_model] with the same M, or None.
        n_layer, batch_size, d_model: what the model and its input expect.
        dtypes: the floating dtypes a memory tensor may have (the model's parameter dtype, and the
            autocast dtype inside ``torch.autocast``); None accepts any floating dtype.
        device: the model's device; None skips the device check.

    Raises:
        TxlError: not a list of tensors, wrong number of layers, rank, batch size, width, unequal
            lengths, a non-floating or unexpected dtype (e.g. float64 memory for a float32 model),
            or another device.
    """
    if mems is None:
        return 0
    if not isinstance(mems, (list, tuple)) or len(mems) != n_layer:
        got = len(mems) if isinstance(mems, (list, tuple)) else type(mems).__name__
        raise TxlError(f"mems must be a list of {n_layer} tensors (one per layer), got {got}")
    for i, m in enumerate(mems):
        if not isinstance(m, torch.Tensor):
            raise TxlError(f"mems[{i}] must be a torch.Tensor [batch, mem_len, d_model], got {type(m).__name__}; "
                           "pass the mems returned by the previous call")
    mlen = mems[0].size(1) if mems[0].dim() == 3 else -1
    for i, m in enumerate(mems):
        if m.dim() != 3:
            raise TxlError(f"mems[{i}] must be [batch, mem_len, d_model], got shape {tuple(m.shape)}")
        if m.size(0) != batch_size:
            raise TxlError(f"mems batch size {m.size(0)} does not match input batch size {batch_size}; "
                           "start a new memory (mems=None) when the batch size changes")
        if m.size(2) != d_model:
            raise TxlError(f"mems width {m.size(2)} does not match d_model {d_model}")
        if m.size(1) != mlen:
            raise TxlError(f"mems[{i}] has length {m.size(1)} but mems[0] has {mlen}")
        if not m.is_floating_point() or (dtypes is not None and m.dtype not in dtypes):
            want = " or ".join(str(d).removeprefix("torch.") for d in dtypes) if dtypes else "a floating dtype"
            raise TxlError(f"mems[{i}] has dtype {str(m.dtype).removeprefix('torch.')} but the model expects {want}; "
                           "pass the mems returned by the previous call, or convert them with .to(dtype)")
        if device is not None and m.device != device:
            raise TxlError(f"mems[{i}] is on {m.device} but the model is on {device}")
    return mlen


def update_mems(mems: Mems | None, hids: Mems, mem_len: int, detach: bool = True) -> Mems:
    """New memory: the last ``mem_len`` states of concat(old memory, current layer inputs) (paper §3.2).

    Args:
        mems: old memory, ``n_layer`` tensors [B, M, d] or None.
        hids: inputs of each layer for the current segment, ``n_layer`` tensors [B, T, d].
        mem_len: memory length to keep in tokens (0 gives empty [B, 0, d] tensors).
        detach: True (the paper's stop-gradient SG(.)): detached, contiguous tensors. False: the
            tensors keep the autograd graph (truncated back-propagation through time), so a loss on
            a later segment back-propagates into the segments whose states they hold.

    Returns:
        ``n_layer`` tensors [B, min(M + T, mem_len), d], same dtype and device as ``hids``.
    """
    with torch.no_grad() if detach else contextlib.nullcontext():
        new = []
        for i, h in enumerate(hids):
            cat = h if mems is None else torch.cat([mems[i], h], dim=1)
            kept = cat[:, max(0, cat.size(1) - mem_len):]
            new.append(kept.detach().contiguous() if detach else kept)
    return new


def given_length(mems) -> int:
    """Positions of a memory as callers hand it (``n_layer`` tensors [B, M, d]): M, or 0 for None or anything
    that is not such a memory (the model's own check refuses that with one line when it reads it)."""
    first = mems[0] if isinstance(mems, (list, tuple)) and mems else None
    return first.size(1) if torch.is_tensor(first) and first.dim() == 3 else 0
