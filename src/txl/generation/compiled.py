"""Compiled decoding: one-token steps over a ring of fixed shape, run by :class:`~txl.model.graphs.RingStep`.

``generate(..., compile=True)`` and the PyTorch side of ``txl bench --export`` decode with
:class:`RingDecoder`: the prompt is read by the model's own forward into a decoding state without spare
room, and every later token is one call of the step module, compiled once for every fill of the ring.
"""

from __future__ import annotations

import torch
from torch import nn

from txl.config import AttentionSpan
from txl.errors import TxlError
from txl.model.decoding import DecodingState, ring_capacity
from txl.model.graphs import RingStep
from txl.runtime import compile_module
from txl.segments import segments

BACKENDS = ("inductor", "aot_eager", "eager")  # torch.compile backends RingDecoder takes


class RingDecoder:
    """Decoding with a :class:`~txl.model.DecodingState` whose one-token steps run :class:`RingStep`,
    optionally compiled: ``generate(..., compile=True)``, and the PyTorch side of ``txl bench --export``.

    The state has no spare room (every layer's keys and values in one tensor [2, L, B, H, S, D], slot 0
    at position 0), so a compiled step is one graph for every step, whatever the memory holds (no
    recompilation as it fills). The prompt is read by the model's own forward into the state, as
    :func:`txl.generation.prime_memory` reads it; a step hands the stack and the counters ``write``
    (``next_slot``) and ``fill`` (``length``) to the step module, whose counters are int64 [] tensors
    made once per value, and writes the new token's key and value into slot ``write`` in place.

    Args:
        model: a :class:`~txl.model.TransformerXLLM` in eval mode (no autograd is used).
        span: the span to read and decode with (:func:`~txl.model.graphs.check_exportable` holds).
        compile: wrap the step in ``torch.compile(fullgraph=True)``: True (inductor) or a backend's name
            (e.g. "aot_eager"); False: run it eagerly.

    Raises:
        TxlError: as :func:`~txl.model.graphs.check_exportable`.
    """

    def __init__(self, model: nn.Module, span: AttentionSpan, compile: bool | str = False) -> None:
        self.model, self.span, self.capacity = model, span, ring_capacity(span)
        self.step_module = RingStep(model, span)
        if compile:
            backend = compile if isinstance(compile, str) else "inductor"
            if backend not in BACKENDS:  # (others, e.g. cudagraphs, may hand back outputs a later step overwrites)
                raise TxlError(f"compile takes True or one of {', '.join(BACKENDS)}, got {compile!r}")
            self.step_module = compile_module(self.step_module, fullgraph=True, dynamic=False, backend=backend)
        self.state = self.state_for(model, span)
        self.mems: list[torch.Tensor] | None = None  # a starting memory not read into the state yet
        # the counters' values 0 ... S on the model's device (one copy there), and (counter, value) -> its own
        # int64 [] tensor, cut from them once per value on the device: no copy from the host per step
        self._values = torch.arange(self.capacity + 1, device=model.word_emb.emb_layers[0].weight.device)
        self._counters: dict[tuple[int, int], torch.Tensor] = {}

    @staticmethod
    def state_for(model: nn.Module, span: AttentionSpan) -> DecodingState:
        """A fresh state of the layout the step reads: S slots from position 0, no spare room, no inputs kept."""
        return DecodingState(model.config.n_layer, span, keep_mems=False, spare_room=False)

    @torch.no_grad()
    def read_prompt(self, input_ids: torch.Tensor, mems: list[torch.Tensor] | None = None) -> None:
        """Read ``input_ids`` (int64 [B, T], T >= 0 tokens: the prompt without the token the first
        :meth:`step` reads) in calls of ``tgt_len`` after ``mems`` (``n_layer`` tensors [B, M', d], e.g.
        a ``txl serve`` session's memory) or from no memory (None), into a fresh state (what an earlier
        call read is dropped)."""
        self.state = self.state_for(self.model, self.span)
        self.mems = mems
        for seg in segments(self.model, input_ids.to(torch.long), span=self.span, mems=mems, caches=self.state):
            self.mems = seg.output.mems  # (None: the state holds the memory)

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One token per row (int64 [B, 1]) after what was read: the next-token logits [B, V] (as the
        model's ``crit.logits``); the token's keys and values go to slot ``write`` (in place). A first
        token with nothing in the state yet is read by the model's forward.

        Raises:
            TxlError: the state was left half written by a call that failed, or ``input_ids`` has another
                batch size than what was read.
        """
        state = self.state
        state.check_usable()
        if state.length == 0:
            out = self.model(input_ids, mems=self.mems, caches=state, span=self.span)
            self.mems = None
            return out.logits[:, -1]
        # one layout for every step (a prompt's last column is strided, a sampled token's is not): one graph
        input_ids = input_ids.to(torch.long).clone(memory_format=torch.contiguous_format)
        state.check_call(input_ids.size(0), state.dtype)
        keys, values = state.stack.unbind(0)
        write = state.next_slot
        logits, key, value = self.step_module(input_ids, keys, values, self._counter(0, write),
                                              self._counter(1, state.length))
        keys.select(3, write).copy_(key)
        values.select(3, write).copy_(value)
        state.commit_step()
        return logits

    def _counter(self, which: int, value: int) -> torch.Tensor:
        """``value`` of counter ``which`` (0 write, 1 fill) as an int64 [] tensor on the model's device, made
        once per value by a copy on the device (a copy from the host per step would wait for a GPU). The two
        counters never share a tensor, even when equal: a graph compiled for two inputs would be compiled
        again for one input passed twice."""
        if (which, value) not in self._counters:
            self._counters[which, value] = self._values[value].clone()
        return self._counters[which, value]
