"""The attention span: how many tokens a segment holds and how far back its queries look (paper §3.2, §3.3).

A span does not touch the weights, so one trained model can be read with another span, e.g. a
longer memory at evaluation time (§3.2: "the memory length can be increased at test time"). It is
a frozen value passed to :meth:`txl.model.TransformerXLLM.forward` and to every function that reads
text segment by segment; the model's config holds only the training span and is never changed.
"""

from __future__ import annotations

import numbers
import dataclasses
from dataclasses import dataclass
from typing import Any

from txl.config.fields import SPAN_FIELDS, SPAN_MINIMUM, check_minimums
from txl.errors import TxlError


@dataclass(frozen=True)
class AttentionSpan:
    """Segment and memory settings for reading text with a Transformer-XL model.

    Attributes:
        tgt_len: tokens per segment (>= 1): the query length T of one forward pass.
        mem_len: hidden states kept per layer as memory (>= 0 tokens; 0: no memory carried).
        clamp_len: relative distances above this use the encoding of ``clamp_len`` (>= 0; 0: none).
        same_length: every query sees the last ``mem_len`` keys up to and including itself
            (no effect with ``mem_len == 0``; compressed slots stay visible to every query).
        cmem_len: compressed-memory slots kept per layer (>= 0; 0: none). Only a model built with
            ``cmem_len > 0`` (it owns the compression network) can read with ``cmem_len > 0``; with it
            the memory ``mems`` has the compressive layout of :mod:`txl.model.compressive`.

    Raises:
        TxlError: a non-integer length, ``tgt_len < 1``, ``mem_len < 0``, ``clamp_len < 0`` or a non-bool
            ``same_length``, ``cmem_len < 0``.
    """

    tgt_len: int
    mem_len: int
    clamp_len: int = 0
    same_length: bool = False
    cmem_len: int = 0

    def __post_init__(self) -> None:
        for name in ("tgt_len", "mem_len", "clamp_len", "cmem_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TxlError(f"span.{name} must be an integer, got {value!r}")
            object.__setattr__(self, name, int(value))  # a numpy integer becomes a Python int
        if not isinstance(self.same_length, bool):
            raise TxlError(f"span.same_length must be true or false, got {self.same_length!r}")
        check_minimums(self, SPAN_MINIMUM, "span.", {"clamp_len": " (0: no clamping)",
                                                     "cmem_len": " (0: no compressed memory)"})

    @classmethod
    def of(cls, config: Any) -> "AttentionSpan":
        """The training span of a :class:`~txl.model.TransformerXLConfig` (its five span fields)."""
        return cls(config.tgt_len, config.mem_len, config.clamp_len, config.same_length, getattr(config, "cmem_len", 0))

    def replace(self, *, tgt_len: int | None = None, mem_len: int | None = None, clamp_len: int | None = None,
                same_length: bool | None = None, cmem_len: int | None = None) -> "AttentionSpan":
        """A copy with the given fields changed; None keeps a field.

        Raises:
            TxlError: an impossible resulting value (see the class).
        """
        values = {k: v for k, v in zip(SPAN_FIELDS, (tgt_len, mem_len, clamp_len, same_length, cmem_len)) if v is not None}
        return dataclasses.replace(self, **values) if values else self

    def to_dict(self) -> dict[str, Any]:
        """``{"tgt_len": ..., "mem_len": ..., "clamp_len": ..., "same_length": ..., "cmem_len": ...}`` for reports."""
        return dataclasses.asdict(self)


def check_readable(config: Any, span: AttentionSpan) -> None:
    """Refuse a span the model of ``config`` cannot read with: compressed-memory slots (``cmem_len > 0``)
    need a model built with a compressed memory (it owns the compression network).

    Raises:
        TxlError: one line naming ``cmem_len`` and what to do.
    """
    if span.cmem_len and not getattr(config, "cmem_len", 0):
        raise TxlError(f"cmem_len={span.cmem_len} needs a model with a compressed memory (model.cmem_len > 0: it "
                       "owns the compression network); this model has none: read it with cmem_len 0 (leave "
                       "--cmem-len out)")


def resolve_span(config: Any, span: AttentionSpan | None = None, *, tgt_len: int | None = None,
                 mem_len: int | None = None, clamp_len: int | None = None,
                 same_length: bool | None = None, cmem_len: int | None = None) -> AttentionSpan:
    """``span`` (None: the config's training span) with the given fields overridden (None keeps a field).

    This is how the library functions that take ``tgt_len=None, mem_len=None, ...`` keywords build
    the one span they pass down.

    Raises:
        TxlError: ``span`` is not an :class:`AttentionSpan`, an impossible resulting value, or one the
            model cannot read with (:func:`check_readable`).
    """
    if span is None:
        span = AttentionSpan.of(config)
    elif not isinstance(span, AttentionSpan):
        raise TxlError(f"span must be an AttentionSpan, got {type(span).__name__}")
    span = span.replace(tgt_len=tgt_len, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length,
                        cmem_len=cmem_len)
    check_readable(config, span)
    return span
