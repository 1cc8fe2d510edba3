"""The Transformer-XL language model (Dai et al. 2019) and its vanilla-Transformer baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from txl.model.adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, tie_adaptive
from txl.model.attention import MultiHeadAttention, attention_mask
from txl.model.compressive import Compressor, check_compressive_mems, layer_memory, split_mems, update_compressive
from txl.config import CHECKSUMS_NAME, IGNORE_INDEX, RUN_NAME, check_readable, check_weights_dtype, AttentionSpan, TransformerXLConfig
from txl.model.decoding import DecodingState, LayerCache, check_state, slot_padding_mask
from txl.kernels.cpu import Dropout, Linear
from txl.model.parameters import init_weights
from txl.model.positions import SCHEMES
from txl.model.checks import check_input_ids, check_labels, padding_mask
from txl.kernels.int8 import quantize_int8
from txl.model.memory import Mems, check_mems, update_mems
from txl.fileio.model_files import (CONFIG_NAME, check_weights_header, int8_names, load_weights, read_model_config,
                                    save_model, weight_shapes)
from txl.runtime import memory_bytes
from txl.errors import TxlError


@dataclass
class LMOutput:
    """What :meth:`TransformerXLLM.forward` returns.

    Attributes:
        logits: float [B, T, vocab_size] next-token scores (softmax gives the probabilities): raw
            logits for a plain softmax, log-probabilities for an adaptive softmax. None when an
            adaptive softmax (``cutoffs``) computed the loss from labels, so that no [B, T, V]
            tensor is built in training.
        loss: float scalar, mean negative log-likelihood in nats over labels != -100 (0 when every
            label is -100; None without labels).
        mems: new memory, ``n_layer`` detached tensors [B, <= mem_len, d_model]; None for ``attn_type="abs"``.
            With a compressive span (``cmem_len > 0``): ``3 * n_layer`` tensors, memory, compressed
            memory and pending states (layout in :mod:`txl.model.compressive`).
        token_loss: float [B, T] per-token negative log-likelihood in nats, 0 where labels == -100
            (None without labels).
        recon_loss: the attention-reconstruction loss of the compressive memory (Rae et al. 2019,
            §3.2), summed over layers: float scalar, computed only with autograd enabled and a
            compressive span, else None. Not part of ``loss``; its gradient reaches only the
            compression networks (training adds it weighted by ``recon_loss_weight``).
    """

    logits: torch.Tensor | None
    loss: torch.Tensor | None
    mems: Mems | None
    token_loss: torch.Tensor | None = None
    recon_loss: torch.Tensor | None = None


class PositionwiseFF(nn.Module):
    """Position-wise feed-forward sub-layer: Linear-ReLU-Dropout-Linear-Dropout with residual and LayerNorm."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool) -> None:
        super().__init__()
        self.pre_lnorm = pre_lnorm
        self.net = nn.Sequential(Linear(d_model, d_inner), nn.ReLU(inplace=True), Dropout(dropout),
                                 Linear(d_inner, d_model), Dropout(dropout))
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """[B, T, d_model] -> [B, T, d_model]."""
        if self.pre_lnorm:
            return h + self.net(self.layer_norm(h))
        return self.layer_norm(h + self.net(h))

    def step(self, h: torch.Tensor) -> torch.Tensor:
        """[B, 1, d_model] -> [B, 1, d_model] of a decoding step: :meth:`forward` in eval mode (no
        dropout), with functional calls instead of five sub-module calls (a step is mostly call overhead)."""
        first, second, norm = self.net[0], self.net[3], self.layer_norm
        x = F.layer_norm(h, norm.normalized_shape, norm.weight, norm.bias, norm.eps) if self.pre_lnorm else h
        y = second.forward(torch.relu_(first.forward(x)))
        if self.pre_lnorm:
            return h + y
        return F.layer_norm(h + y, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


class DecoderLayer(nn.Module):
    """One Transformer-XL layer: attention over [memory + segment], then the feed-forward net."""

    def __init__(self, config: TransformerXLConfig,
                 shared_biases: tuple[nn.Parameter, nn.Parameter] | None = None) -> None:
        super().__init__()
        c = config
        self.attn = MultiHeadAttention(c, SCHEMES[c.attn_type](c, shared_biases))
        self.ff = PositionwiseFF(c.d_model, c.d_inner, c.dropout, c.pre_lnorm)
        if c.cmem_len > 0:  # the compression function f_c of this layer (Rae et al. 2019)
            self.compress = Compressor(c.d_model, c.cmem_ratio, c.compression)

    def forward(self, h: torch.Tensor, mem: torch.Tensor | None, positions, mask: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:
        """[B, T, d_model] -> [B, T, d_model]; see :meth:`MultiHeadAttention.forward` for the arguments."""
        return self.ff(self.attn(h, mem, positions, mask, cache))

    def step(self, h: torch.Tensor, cache: LayerCache, key_mask: torch.Tensor | None = None,
             positions=None) -> torch.Tensor:
        """One decoding step [B, 1, d_model] -> [B, 1, d_model]; see :meth:`MultiHeadAttention.step`."""
        return self.ff.step(self.attn.step(h, cache, key_mask, positions))  # evaluation mode only (see check_state)


class TransformerXLLM(nn.Module):
    """Transformer-XL language model with segment-level recurrence and relative attention.

    ``attn_type="rel"``: the paper's model (§3.2 recurrence, §3.3 relative positions).
    ``attn_type="shaw"``: the same recurrence with Shaw et al. (2018) learned relative positions
    (per-layer tables ``layers[n].attn.pos.r_emb``, no u/v): the paper's Table 6 comparison.
    ``attn_type="rope"``: the same recurrence with rotary positions (Su et al. 2021; keys rotated at
    their positions, see :class:`~txl.model.positions.Rotary`).
    ``attn_type="abs"``: the vanilla Transformer baseline (absolute sinusoidal positions added to the
    scaled embedding, causal attention within the segment, no memory).

    Parameters: ``word_emb`` (:class:`~txl.model.adaptive.AdaptiveEmbedding`: a [V, d_embed] table,
    or per-cluster tables and projections with ``cutoffs``; output scaled by sqrt(d_model)), shared
    ``r_w_bias`` and ``r_r_bias`` [n_head, d_head] (unless ``untie_r``), ``layers`` and ``crit``
    (:class:`~txl.model.adaptive.ProjectedAdaptiveLogSoftmax`: output weights with bias, tied to the
    embedding with ``tie_weight`` and ``tie_projs``). All are initialised by :meth:`reset_parameters`
    once they exist and are tied, by the same rule the adaptive modules apply to themselves when built
    alone (their draws come first, so a seed's weights depend on both passes).

    Shared u/v are created on this module and tied into every layer's attention at construction
    (the same Parameter objects, like a tied softmax weight), so ``named_parameters()`` and saved
    checkpoints hold them once, under ``r_w_bias``/``r_r_bias``.
    """

    param_kinds = {"r_w_bias": "position_bias", "r_r_bias": "position_bias"}  # see txl.model.parameters

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        config.check()
        if torch.get_default_device().type != "meta":  # a damaged config: one line (physical memory, a constant)
            config.check_fits(memory_bytes())
        self.config = config
        c = config
        self.word_emb = AdaptiveEmbedding(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val,
                                          c.init_std, c.proj_init_std)
        self.drop = Dropout(c.dropout)
        self.positions = SCHEMES[c.attn_type]  # the scheme's class: what a call builds once for every layer
        shared = self.positions.shared_parameters(c)  # "rel": u and v, unless untie_r
        if shared is not None:
            self.r_w_bias, self.r_r_bias = shared
        self.layers = nn.ModuleList(DecoderLayer(c, shared) for _ in range(c.n_layer))
        self.crit = ProjectedAdaptiveLogSoftmax(c.vocab_size, c.embed_dim, c.d_model, c.cutoffs, c.div_val,
                                                c.init_std, c.proj_init_std)
        tie_adaptive(self.word_emb, self.crit, c.tie_weight, c.tied_projections)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every parameter by its kind with :func:`~txl.model.parameters.init_weights`:
        normal(0, init_std) for weights, embeddings, u/v, Shaw tables and cluster weights;
        normal(0, proj_init_std) for adaptive projections; zeros for biases; ones for LayerNorm gains."""
        init_weights(self, self.config.init_std, self.config.proj_init_std)

    def forward(self, input_ids: torch.Tensor, mems: Mems | None = None,
                labels: torch.Tensor | None = None, caches: DecodingState | None = None,
                span: AttentionSpan | None = None, detach_mems: bool = True,
                mem_padding: torch.Tensor | None = None) -> LMOutput:
        """Score one segment given the memory of the previous ones.

        Args:
            input_ids: int64 [B, T] token ids in ``[0, vocab_size)`` (a tensor; B, T >= 1).
            mems: memory from the previous segment's output (``n_layer`` tensors [B, M, d_model] of
                the model's dtype and device) or None to start fresh. Must be None for ``attn_type="abs"``.
            labels: int64 [B, T] next tokens already aligned with ``input_ids`` (no shift is done
                here); positions equal to -100 are ignored.
            caches: a caller-owned :class:`~txl.model.DecodingState` for incremental decoding
                (no autograd, an ``attn_type`` with memory; see :func:`txl.generation.generate_steps`).
                It holds the memory as the keys and values of the remembered tokens: ``mems`` may
                start it (first call only) and the returned ``mems`` is None; read the hidden-state
                memory with ``caches.mems()``. One-token calls take the ring-buffer step (no copy of
                the memory). The logits are the same as without it. Its span is used (``span``, if
                given, must equal it).
            span: the :class:`~txl.model.AttentionSpan` to read with (``mem_len`` of the new
                memory, ``clamp_len``, ``same_length``; ``tgt_len`` is the caller's business: the
                segment is ``input_ids``). None: the config's training span. ``self.config`` is
                never changed.
            detach_mems: True (the paper's stop-gradient, §3.2): the new memory is detached. False:
                it keeps this segment's autograd graph, so a loss on a later segment back-propagates into
                this one (truncated back-propagation through time).
            mem_padding: int64 [B]: the first ``mem_padding[b]`` memory positions of row b are padding
                (a batch of rows whose memories have different lengths, left-padded to one length M);
                no query attends to them. A row's real memory is its last ``M - mem_padding[b]``
                positions, so its relative distances are those it has alone and its outputs equal
                those of the row alone (up to float rounding). None: no padding.

        Returns:
            :class:`LMOutput` with logits [B, T, V], the mean NLL (nats) and the new memory.

        Raises:
            TxlError: ``input_ids`` that is not an integer tensor [B, T] with B, T >= 1 on the model's
                device (a Python list, an empty batch), ids outside the vocabulary; ``mems`` that do
                not match the input or have another dtype than the model's parameters (or the
                autocast dtype inside ``torch.autocast``) or another device; ``labels`` that are not
                an integer tensor shaped like ``input_ids``, or hold values outside ``[0, vocab_size)``
                other than -100; a ``span`` that is not an AttentionSpan; ``caches`` used with autograd
                or in training mode (its one-token step has no dropout), or holding another model's keys.
                Value (range) checks run on CPU tensors only, and not while ``torch.compile`` traces the
                model (:mod:`txl.model.checks`, docs/compile.md). With ``caches``: a call past the state's
                ``max_tokens``, or keys and values its device cannot allocate. (Whether a very long
                segment's attention fits in memory is checked by the reading loops,
                :func:`txl.segments.segments` and training, before they start, not here.)
        """
        if labels is not None and caches is not None:  # refused before the decoding state takes the segment in
            check_input_ids(input_ids, self.config.vocab_size, self.word_emb.emb_layers[0].weight.device)
            labels = check_labels(labels, input_ids, self.config.vocab_size)
        h, new_mems, recon = self._body(input_ids, mems, caches, detach_mems, span, mem_padding)
        if labels is not None and caches is None:  # _body has checked input_ids (labels must have its shape)
            labels = check_labels(labels, input_ids, self.config.vocab_size)
        logits, token_loss, loss = self._output(h, labels)
        return LMOutput(logits=logits, loss=loss, mems=new_mems, token_loss=token_loss, recon_loss=recon)

    def hidden_states(self, input_ids: torch.Tensor, mems: Mems | None = None, detach_mems: bool = True,
                      span: AttentionSpan | None = None,
                      same_layer: bool = False) -> tuple[torch.Tensor, Mems | None]:
        """The last layer's output for one segment and the new memory, without the softmax.

        Same computation as :meth:`forward` up to the output layer (final dropout included), for
        heads other than the language-model softmax (e.g. :mod:`txl.classification`).

        Args:
            input_ids: int64 [B, T] token ids in ``[0, vocab_size)``.
            mems: ``n_layer`` tensors [B, M, d_model] from the previous segment, or None.
            detach_mems, span: as in :meth:`forward` (None: the config's span).
            same_layer: False (the paper, §3.2): layer n's memory is its input, layer n-1's output (a reach
                of ``n_layer x mem_len`` tokens). True: ERNIE-Doc's enhanced recurrence (Ding et al. 2021,
                §3.2): layer n's memory is its own output, with no bound on the reach (for a model trained
                with the paper's memory, a fine-tuning variant).

        Returns:
            ``(h, new_mems)``: float [B, T, d_model] hidden states and ``n_layer`` tensors
            [B, <= mem_len, d_model] (None for ``attn_type="abs"``).

        Raises:
            TxlError: as :meth:`forward` for bad ``input_ids``, ``mems`` or ``span``; ``same_layer`` with
                a compressed memory.
        """
        return self._body(input_ids, mems, None, detach_mems, span, same_layer=same_layer)[:2]

    def _body(self, input_ids: torch.Tensor, mems: Mems | None, caches: DecodingState | None,
              detach_mems: bool, span: AttentionSpan | None, mem_padding: torch.Tensor | None = None,
              same_layer: bool = False) -> tuple[torch.Tensor, Mems | None, torch.Tensor | None]:
        """Embedding and layers: hidden states [B, T, d_model], the new memory (``same_layer``: see
        :meth:`hidden_states`) and the reconstruction loss (see :meth:`forward`)."""
        c = self.config
        if caches is not None:
            span = check_state(caches, self, mems, span)
        elif span is None:
            span = c.span
        elif not isinstance(span, AttentionSpan):
            raise TxlError(f"span must be an AttentionSpan, got {type(span).__name__}")
        weight = self.word_emb.emb_layers[0].weight
        key_dtype, mem_dtypes = self._dtypes(weight)
        bsz, qlen = check_input_ids(input_ids, c.vocab_size, weight.device)
        if not self.config.has_memory and mems is not None:
            raise TxlError(f"attn_type={c.attn_type!r} (vanilla Transformer) has no memory: pass mems=None")
        if span.cmem_len > 0:
            if same_layer:
                raise TxlError("same-layer memory (enhanced recurrence) is not supported with a compressed memory")
            if mem_padding is not None:
                raise TxlError("mem_padding (prompts of different lengths) is not supported with a compressed "
                               "memory: decode such prompts one at a time")
            return self._compressive_body(input_ids, mems, caches, detach_mems, span, bsz, mem_dtypes)
        mlen = check_mems(mems, c.n_layer, bsz, c.d_model, dtypes=mem_dtypes, device=weight.device)
        if caches is not None:
            if caches.length > 0:
                mlen = caches.memory_length
            caches.check_call(bsz, key_dtype, mlen + qlen - caches.memory_length)
            if caches.length > 0 and qlen == 1:  # the ring step: no mask (but the padding), no memory copy
                return self._step(input_ids, caches, mem_padding, key_dtype), None, None
        klen = mlen + qlen

        emb = self.word_emb(input_ids)  # [B, T, d_model], scaled by sqrt(d_model)
        memory = self.config.has_memory
        first = 0 if caches is None else caches.seen - caches.memory_length  # the text position of key 0
        positions = self.positions.segment(c, klen, first, span, emb.device, emb.dtype, self.drop, caches)
        h = self.drop(self.positions.embed(emb))  # "abs": positions 0 .. T-1 added to the input
        mask = attention_mask(qlen, mlen, span.same_length and memory, span.mem_len, emb.device)
        if mem_padding is not None and memory:
            mask = mask | padding_mask(mem_padding, bsz, mlen, klen)

        if caches is None:
            h, hids = self._layers(h, mems, positions, mask, None)
        else:  # every check that may still reject the call is behind us
            caches.begin(qlen, klen, (bsz, c.n_head, c.d_head), key_dtype, emb.device)
            caches.bind(bsz, key_dtype)
            try:
                h, hids = self._layers(h, mems, positions, mask, caches)
            except BaseException:
                caches.failed = True  # some layers may have moved or written their buffers, others not
                raise
        if same_layer:  # layer n remembers its own output (caches is None here: hidden_states passes none)
            hids = hids[1:] + [h]
        h = self.drop(h)
        if not memory:
            return h, None, None
        if caches is not None:
            caches.segment_klen = klen  # (the key length whose positions the layers now hold)
            caches.commit(klen)
            return h, None, None
        return h, update_mems(mems, hids, span.mem_len, detach=detach_mems), None

    def _layers(self, h: torch.Tensor, mems: Mems | None, positions, mask: torch.Tensor,
                caches: DecodingState | None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The layer stack over one segment: the last layer's output [B, T, d_model] and every layer's
        input (the states the next memory is made of). No ``try`` here: ``torch.compile`` traces it whole."""
        hids = []
        for i, layer in enumerate(self.layers):
            hids.append(h)
            h = layer(h, None if mems is None else mems[i], positions, mask,
                      None if caches is None else caches.layers[i])
        return h, hids

    def _compressive_body(self, input_ids: torch.Tensor, mems: Mems | None, caches: DecodingState | None,
                          detach_mems: bool, span: AttentionSpan, bsz: int,
                          mem_dtypes: tuple[torch.dtype, ...]) -> tuple[torch.Tensor, Mems | None, torch.Tensor | None]:
        """:meth:`_body` for a span with compressed memory (Rae et al. 2019; :mod:`txl.model.compressive`).

        Attention reads [compressed, pending, memory, segment] with distances counted in key slots; the
        same mask as without compression over [memory, segment], compressed and pending states visible
        to every query. A decoding state holds this memory as tensors (its general path: the result is
        the same as without the state).
        """
        c = self.config
        check_readable(c, span)
        if caches is not None:
            caches.check_call(bsz, caches.dtype)
            caches.bind(bsz, caches.dtype)
            if caches.length > 0:
                mems = caches.held
        weight = self.word_emb.emb_layers[0].weight
        mlen, clen, plen = check_compressive_mems(mems, c.n_layer, bsz, c.d_model, c.cmem_ratio,
                                                  dtypes=mem_dtypes, device=weight.device)
        memory, compressed, pending = split_mems(mems, c.n_layer)
        qlen = input_ids.size(1)
        extra = clen + plen
        klen = extra + mlen + qlen
        emb = self.word_emb(input_ids)
        positions = self.positions.segment(c, klen, 0, span, emb.device, emb.dtype, self.drop)  # slots count
        h = self.drop(emb)
        mask = attention_mask(qlen, mlen, span.same_length, span.mem_len, emb.device)
        if extra:
            mask = torch.cat([mask.new_zeros(qlen, extra), mask], dim=1)
        layer_mems = [layer_memory(memory, compressed, pending, i) for i in range(c.n_layer)]
        h, hids = self._layers(h, layer_mems, positions, mask, None)  # the layer body of every span
        h = self.drop(h)
        new_mems, recon = update_compressive(
            memory, compressed, pending, hids, mem_len=span.mem_len, cmem_len=span.cmem_len,
            compressors=[layer.compress for layer in self.layers], detach=detach_mems,
            attentions=[layer.attn for layer in self.layers])
        if caches is not None:
            caches.hold(new_mems, qlen)
            return h, None, recon
        return h, new_mems, recon

    def _step(self, input_ids: torch.Tensor, state: DecodingState, mem_padding: torch.Tensor | None,
              key_dtype: torch.dtype) -> torch.Tensor:
        """One token per row after the memory held in ``state``: hidden states [B, 1, d_model].

        Same result as the general path for a one-token segment (see :meth:`MultiHeadAttention.step`);
        ``mem_padding`` (see :meth:`forward`) masks the slots holding each row's oldest padding.
        """
        c = self.config
        h = self.drop(self.word_emb(input_ids))
        key_mask = None if mem_padding is None else slot_padding_mask(state, mem_padding, input_ids.size(0))
        klen = min(state.length + 1, state.capacity)
        state.begin(1, klen, (input_ids.size(0), c.n_head, c.d_head), key_dtype, h.device)
        positions = self.positions.step_positions(state, c, h.device, h.dtype)
        state.bind(input_ids.size(0), key_dtype)
        try:
            for layer, cache in zip(self.layers, state.layers):
                h = layer.step(h, cache, key_mask, positions)
        except BaseException:
            state.failed = True  # some layers may have written the token's slot, others not
            raise
        state.commit(klen)
        return self.drop(h)

    @staticmethod
    def _dtypes(weight: torch.Tensor) -> tuple[torch.dtype, tuple[torch.dtype, ...]]:
        """The keys' dtype of a call, and the dtypes a memory may have, for parameters ``weight``: inside
        ``torch.autocast`` for their device, the keys of float32 parameters take the autocast dtype
        (autocast casts float32 only) and a memory may hold either dtype; else the parameters'.

        Raises:
            TxlError: half-precision parameters inside an autocast to the other half dtype (bfloat16
                weights under a float16 autocast: no kernel multiplies the two).
        """
        kind = weight.device.type
        if kind not in ("cpu", "cuda") or not torch.is_autocast_enabled(kind):
            return weight.dtype, (weight.dtype,)
        cast = torch.get_autocast_dtype(kind)
        if weight.dtype in (torch.bfloat16, torch.float16):
            name, own = str(cast).removeprefix("torch."), str(weight.dtype).removeprefix("torch.")
            check_weights_dtype(own, name, dtype_text=f"torch.autocast to {name}",
                                advice=f"autocast to {own}, or not at all")
        return (cast if weight.dtype == torch.float32 else weight.dtype), (weight.dtype, cast)

    def _output(self, h: torch.Tensor, labels: torch.Tensor | None):
        """Logits [B, T, V] (or None), per-token NLL [B, T] and mean NLL for hidden states h [B, T, d]."""
        bsz, qlen, _ = h.shape
        flat = h.reshape(bsz * qlen, -1)
        if labels is not None and self.config.cutoffs:  # adaptive softmax: never build [B, T, V]
            logits = None
            token_loss = self.crit(flat, labels.reshape(-1)).view(bsz, qlen)
        else:
            logits = self.crit.logits(flat)  # [B*T, V]
            token_loss = None
            if labels is not None:
                wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
                token_loss = F.cross_entropy(wide, labels.reshape(-1), ignore_index=IGNORE_INDEX,
                                             reduction="none").view(bsz, qlen)
            logits = logits.view(bsz, qlen, -1)
        loss = None
        if token_loss is not None:
            loss = token_loss.sum() / (labels != IGNORE_INDEX).sum().clamp(min=1)
        return logits, token_loss, loss

    def save_pretrained(self, directory: str | Path, tokenizer: Any = None) -> None:
        """Write ``model.safetensors`` and ``config.json`` (and ``vocab.json`` if a tokenizer is given).

        Each file is written atomically (temporary file, then rename).

        Raises:
            TxlError: ``directory`` is a file, a checkpoint that txl wrote with its checksums (a run's
                ``best/``: new weights would break them) or a run folder (whose ``best/`` commands read).
        """
        if Path(directory).exists() and not Path(directory).is_dir():
            raise TxlError(f"{directory} is a file; save_pretrained writes a folder: give a folder's path")
        if any((Path(directory) / name).exists() for name in (CHECKSUMS_NAME, RUN_NAME, "best", "last")):
            raise TxlError(f"{directory} is a txl checkpoint or run folder: new weights there would break its "
                           "checksums or be read instead of its best/; save to another folder")
        save_model(self, directory, tokenizer)

    @classmethod
    def from_pretrained(cls, directory: str | Path, map_location: str | torch.device = "cpu") -> "TransformerXLLM":
        """Load a model written by :meth:`save_pretrained` (safetensors + JSON only, nothing unpickled).
        A quantised model's int8 layers (:mod:`txl.kernels.int8`) are recognised by their weights'
        names and loaded as they are.

        Raises:
            TxlError: missing directory/config/weights, invalid JSON, or weights that do not match the config.
        """
        config = read_model_config(directory)
        config.check_fits(memory_bytes(), f"{Path(directory) / CONFIG_NAME}")
        shapes = weight_shapes(Path(directory))
        int8 = int8_names(shapes)  # a quantised checkpoint: its int8 layers
        with torch.device("meta"):  # shapes only: compare them with the weights' header before allocating
            check_weights_header(quantize_int8(cls(config), int8, empty=True), Path(directory), CONFIG_NAME, shapes)
        model = cls(config)
        if int8:
            quantize_int8(model, int8, empty=True)
        load_weights(model, Path(directory), map_location, CONFIG_NAME)
        return model.to(map_location).eval()  # inference mode, like a freshly loaded model anywhere
