"""Checks of what callers hand the model: token ids and labels (the memory is checked in :mod:`txl.model.memory`).

Every check raises :class:`~txl.errors.TxlError` naming the argument, never an IndexError,
RuntimeError or AttributeError from deep inside a layer. They cost no host-device
synchronisation: checks of *values* (ids within the vocabulary) run only on CPU tensors, where
they are cheap; on a GPU the tokenizers and data iterators guarantee them, and reading the values
back would stall every step.
"""

from __future__ import annotations

import torch

from txl.config import IGNORE_INDEX
from txl.errors import TxlError
from txl.runtime import reads_values

ID_DTYPES = (torch.int64, torch.int32)


def check_input_ids(input_ids, vocab_size: int, device: torch.device | None = None) -> tuple[int, int]:
    """Check a batch of token ids and return its shape ``(batch, length)``.

    Args:
        input_ids: expected an int64/int32 tensor [B, T] with B >= 1, T >= 1 and ids in ``[0, vocab_size)``
            (the range is checked on CPU tensors only).
        vocab_size: the model's vocabulary size.
        device: the model's device; None skips the device check.

    Raises:
        TxlError: not a tensor (e.g. a Python list), not integer, not 2-D, an empty batch or segment,
            on another device than the model, or an id outside the vocabulary.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise TxlError(f"input_ids must be a torch.Tensor of token ids [batch, seq_len], got "
                       f"{type(input_ids).__name__} (use torch.tensor([...], dtype=torch.long))")
    if input_ids.dim() != 2 or input_ids.dtype not in ID_DTYPES:
        raise TxlError(f"input_ids must be an integer tensor [batch, seq_len], got {input_ids.dtype} "
                       f"{tuple(input_ids.shape)}")
    bsz, qlen = input_ids.shape
    if bsz == 0:
        raise TxlError(f"input_ids has an empty batch (shape {tuple(input_ids.shape)}): pass at least one row")
    if qlen == 0:
        raise TxlError("input_ids is empty: a segment needs at least one token")
    if device is not None and input_ids.device != device:
        raise TxlError(f"input_ids is on {input_ids.device} but the model is on {device}: move it with "
                       f".to({str(device)!r})")
    if reads_values(input_ids):
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= vocab_size:
            raise TxlError(f"input_ids: token id {lo if lo < 0 else hi} is outside the vocabulary [0, {vocab_size})")
    return bsz, qlen


def check_labels(labels, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Check next-token labels for ``input_ids`` and return them as int64.

    Args:
        labels: an integer tensor with the shape and device of ``input_ids``; every value is in
            ``[0, vocab_size)`` or ``IGNORE_INDEX`` (-100), checked on CPU tensors only.

    Raises:
        TxlError: not a tensor, not integer, another shape or device, or a value outside the vocabulary
            that is not -100.
    """
    if not isinstance(labels, torch.Tensor):
        raise TxlError(f"labels must be a torch.Tensor of token ids shaped like input_ids, got {type(labels).__name__}")
    if labels.dtype not in ID_DTYPES:
        raise TxlError(f"labels must be an integer tensor (int64), got {labels.dtype}")
    if labels.shape != input_ids.shape:
        raise TxlError(f"labels shape {tuple(labels.shape)} differs from input_ids {tuple(input_ids.shape)}")
    if labels.device != input_ids.device:
        raise TxlError(f"labels are on {labels.device} but input_ids on {input_ids.device}")
    if reads_values(labels):
        bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
        if bool(bad.any()):
            value = int(labels[bad][0])
            raise TxlError(f"labels: value {value} is outside the vocabulary [0, {vocab_size}) and is not "
                           f"{IGNORE_INDEX} (the ignored position)")
    return labels.long()


def padding_mask(mem_padding: torch.Tensor, batch: int, mlen: int, klen: int) -> torch.Tensor:
    """bool [B, 1, 1, K]: True at the first ``mem_padding[b]`` keys of row b (left padding of its memory).

    Raises:
        TxlError: ``mem_padding`` that is not an integer tensor [B] with values in ``[0, M]``.
    """
    if not isinstance(mem_padding, torch.Tensor) or mem_padding.shape != (batch,) or mem_padding.is_floating_point():
        raise TxlError(f"mem_padding must be an integer tensor [batch] = [{batch}]")
    if reads_values(mem_padding) and batch and (int(mem_padding.min()) < 0 or int(mem_padding.max()) > mlen):
        raise TxlError(f"mem_padding values must be in [0, memory length {mlen}], got {mem_padding.tolist()}")
    keys = torch.arange(klen, device=mem_padding.device)
    return (keys[None, :] < mem_padding[:, None])[:, None, None, :]
