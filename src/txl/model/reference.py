"""Transformer-XL's mathematics in the plainest PyTorch: read this module first.

Everything the fast paths (training, evaluation, the decoding state, the one-token step) compute is
written here once, slowly and literally, and the tests hold every fast path equal to it in float64.
It takes a :class:`~txl.model.TransformerXLLM`'s weights and owns nothing else: no memory structure
(each segment's keys are rebuilt from the history of layer inputs), no rel-shift (a distance is an
index), no fused kernel (every sum is an einsum). Evaluation mode only: no dropout.

The equations, as numbered in Dai et al. (2019), with n the layer and τ the segment:

- §3.2, recurrence: the keys of segment τ+1 read ``h̃ = [SG(m^{n-1}_τ) ∘ h^{n-1}_{τ+1}]``, the memory
  ``m`` being the layer's inputs at the last ``mem_len`` positions before the segment;
  ``q = h W_q``, ``k = h̃ W_kE``, ``v = h̃ W_v`` (:func:`attention`).
- §3.3, eq. in the text: relative attention of query i to key j at distance ``i - j``::

      A_ij = q_i·k_j (a)  +  q_i·W_kR R_{i-j} (b)  +  u·k_j (c)  +  v·W_kR R_{i-j} (d)

  with R the sinusoid table of distances (:func:`sinusoid_table`), u = ``r_w_bias``, v = ``r_r_bias``;
  ``a = softmax(A / sqrt(d_head))`` over the visible keys, then ``o = a v W_o``, residual and LayerNorm,
  then the position-wise feed-forward net (§3.3's final equations). Two settings of the authors'
  code: ``clamp_len`` caps ``i - j`` in R, ``same_length`` hides keys ``mem_len`` or more back.
- Shaw et al. (2018), the paper's Table 6 comparison: ``A_ij = q_i·k_j + q_i·a_{min(i-j, max_dist)}``,
  a learned table ``a`` per layer, no u, v.
- Rotary positions (Su et al. 2021, ``attn_type="rope"``): q_i and k_j rotated by their positions;
  per pair of dimensions (f, f + D/2), with ``θ_f = 10000^(-2f/D)`` and d = i - j::

      A_ij = Σ_f (q_i,f k_j,f + q_i,f' k_j,f') cos(d θ_f) - (q_i,f' k_j,f - q_i,f k_j,f') sin(d θ_f)

  (f' = f + D/2): a function of the distance only, written here as such, no rotation of anything.
- The vanilla Transformer (§3.1, ``attn_type="abs"``): positions ``0 .. T-1`` added to the embedding,
  ``A_ij = q_i·k_j``, causal within the segment, no memory.
- Compressive memory (Rae et al. 2019, §3, Algorithms 1-2): states leaving the memory are compressed
  ``c = cmem_ratio`` at a time by f_c (:func:`compress`); keys are [compressed, pending, memory,
  segment] and distances count key slots (a compressed slot is one step older than the slot after it).

R is built in float32 and then cast, as the model builds it, so that float64 comparisons hold to
rounding. The embedding (adaptive input, §4 of Baevski & Auli) and the output layer (adaptive softmax)
are the model's own modules: they are tested on their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from txl.errors import TxlError
from txl.kernels.int8 import Int8Linear
from txl.config import AttentionSpan


@dataclass
class ReferenceOutput:
    """What :func:`forward` computes for a text read in segments.

    Attributes:
        logits: float [B, L, V], every position's next-token logits.
        layer_inputs: per layer, float [B, L, d_model]: ``h^{n-1}`` at every position (what the memory holds).
        probs: per segment, per layer, float [B, H, T, K]: the attention over that segment's keys
            ([compressed, pending, memory, segment], oldest first); hidden keys get exactly 0.
        distances: per segment, int64 [T, K]: key j's distance from query i, in key slots.
    """

    logits: torch.Tensor
    layer_inputs: list[torch.Tensor]
    probs: list[list[torch.Tensor]]
    distances: list[torch.Tensor]


def layer_norm(x: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * gain + bias`` over the last dim (biased variance)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * ln.weight + ln.bias


def sinusoid_table(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """[N] positions or distances -> float32 [N, dim]: ``[sin(p f_0) .. sin(p f_{dim/2-1}), cos(p f_0) ..]``,
    ``f_k = 10000^(-2k/dim)`` (Vaswani et al. 2017; the paper's R, sine half first)."""
    freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device) / dim))
    angle = positions.to(torch.float32)[:, None] * freq[None, :]
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def compress(compressor, states: torch.Tensor) -> torch.Tensor:
    """f_c of Rae et al. (2019): [B, n*c, d] -> [B, n, d], slot k from states ``k*c .. k*c + c - 1``;
    "conv1d" written as a sum over the c taps, or max / mean pooling."""
    c = compressor.ratio
    groups = states.reshape(states.size(0), states.size(1) // c, c, states.size(2))  # [B, n, c, d]
    if compressor.kind == "conv1d":
        weight, bias = compressor.weight.to(states.dtype), compressor.bias.to(states.dtype)
        return torch.einsum("bnki,oik->bno", groups, weight) + bias
    return groups.amax(2) if compressor.kind == "max_pool" else groups.mean(2)


def key_distances(qlen: int, n_before: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """int64 [T, M + T] on ``device``: ``M + i - j``, key j's distance from query i when the segment's T
    positions follow M keys (negative for keys in query i's future)."""
    return n_before + torch.arange(qlen, device=device)[:, None] - torch.arange(n_before + qlen, device=device)[None, :]


def attention(attn, h: torch.Tensor, memory: torch.Tensor, distances: torch.Tensor, hidden: torch.Tensor, *,
              attn_type: str, clamp_len: int, d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention sub-layer (§3.2-3.3), residual and LayerNorm included.

    Args:
        attn: the layer's :class:`~txl.model.attention.MultiHeadAttention` (its weights are read).
        h: float [B, T, d_model], the layer's input for the segment's T positions.
        memory: float [B, M, d_model], the states before them that the keys also read (M may be 0).
        distances: int64 [T, M + T], key j's distance from query i; hidden: bool [T, M + T], True where
            query i may not see key j.

    Returns:
        ``(out, probs)``: float [B, T, d_model] and the attention float [B, H, T, M + T].
    """
    H, D = attn.n_head, attn.d_head
    keys_in = torch.cat([memory, h], dim=1)  # h̃ = [SG(m) ∘ h]
    x = layer_norm(keys_in, attn.layer_norm) if attn.pre_lnorm else keys_in
    w_q, w_k, w_v = dense(attn.qkv_net, h.dtype).split(H * D, dim=0)
    q = (x[:, memory.size(1):] @ w_q.T).unflatten(-1, (H, D))  # [B, T, H, D]
    k = (x @ w_k.T).unflatten(-1, (H, D))  # [B, K, H, D]
    v = (x @ w_v.T).unflatten(-1, (H, D))
    scores = torch.einsum("bihd,bjhd->bhij", q, k)  # (a)
    index = distances.clamp(min=0)  # the future's entries are hidden: any row serves them
    n = int(index.max()) + 1 if index.numel() else 1
    if attn_type == "rel":
        dist = torch.arange(n, device=h.device)
        dist = dist.clamp(max=clamp_len) if clamp_len > 0 else dist
        R = sinusoid_table(dist, d_model).to(h.dtype)  # R_d for every distance d = 0 .. n-1: [n, d_model]
        r_k = (R @ dense(attn.pos.r_net, h.dtype).T).unflatten(-1, (H, D))  # W_kR R_d: [n, H, D]
        u, vb = attn.pos.r_w_bias, attn.pos.r_r_bias
        by_distance = torch.einsum("bihd,nhd->bhin", q, r_k)  # q_i·W_kR R_d for every d
        scores = scores + by_distance.gather(-1, index.expand(*by_distance.shape[:2], -1, -1))  # (b): d = i-j
        scores = scores + torch.einsum("hd,bjhd->bhj", u, k)[:, :, None, :]  # (c)
        scores = scores + torch.einsum("hd,nhd->hn", vb, r_k)[:, index][None]  # (d)
    elif attn_type == "rope":  # the rotated product as a function of the distance (see the module doc)
        half = D // 2
        theta = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64, device=h.device) / D))
        angle = distances.to(torch.float64)[..., None] * theta  # [T, K, D/2]: d θ_f
        cos, sin = angle.cos().to(h.dtype), angle.sin().to(h.dtype)
        q1, q2, k1, k2 = q[..., :half], q[..., half:], k[..., :half], k[..., half:]
        same = torch.einsum("bihf,bjhf->bhijf", q1, k1) + torch.einsum("bihf,bjhf->bhijf", q2, k2)
        cross = torch.einsum("bihf,bjhf->bhijf", q2, k1) - torch.einsum("bihf,bjhf->bhijf", q1, k2)
        scores = torch.einsum("bhijf,ijf->bhij", same, cos) - torch.einsum("bhijf,ijf->bhij", cross, sin)
    elif attn_type == "shaw":
        a = attn.pos.r_emb[torch.arange(n, device=h.device).clamp(max=attn.pos.max_dist)].to(h.dtype)  # a_{min(d, max_dist)}: [n, H, D]
        by_distance = torch.einsum("bihd,nhd->bhin", q, a)
        scores = scores + by_distance.gather(-1, index.expand(*by_distance.shape[:2], -1, -1))
    probs = torch.softmax((scores / math.sqrt(D)).masked_fill(hidden, float("-inf")), dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", probs, v).flatten(2) @ dense(attn.o_net, h.dtype).T
    out = h + o if attn.pre_lnorm else layer_norm(h + o, attn.layer_norm)
    return out, probs


def dense(layer, dtype: torch.dtype) -> torch.Tensor:
    """A linear layer's weight [out, in] as a float matrix: its own, or an int8 layer's dequantised one
    (:class:`~txl.kernels.int8.Int8Linear`: the weights it multiplies by, without the rounding of its inputs)."""
    return layer.dequantize(dtype) if isinstance(layer, Int8Linear) else layer.weight


def feed_forward(ff, h: torch.Tensor) -> torch.Tensor:
    """The position-wise feed-forward sub-layer: ``W_2 relu(W_1 h + b_1) + b_2``, residual, LayerNorm
    (before the net with ``pre_lnorm``, after the sum without)."""
    first, second = ff.net[0], ff.net[3]

    def net(z):
        return torch.relu(z @ dense(first, z.dtype).T + first.bias) @ dense(second, z.dtype).T + second.bias

    return h + net(layer_norm(h, ff.layer_norm)) if ff.pre_lnorm else layer_norm(h + net(h), ff.layer_norm)


def segment_keys(history: torch.Tensor, start: int, span: AttentionSpan, compressor) -> tuple[torch.Tensor, int]:
    """The states a segment starting at ``start`` reads before itself, rebuilt from a layer's history.

    Args:
        history: float [B, >= start, d_model], the layer's input at every position read so far.

    Returns:
        ``(states, always_visible)``: float [B, S, d_model] oldest first, [compressed, pending, memory],
        and how many of them lead the list (compressed and pending: visible to every query).
        The memory is the last ``mem_len`` positions; the positions before it left in order, the first
        ``c * floor(evicted / c)`` of them compressed in groups of c (the newest ``cmem_len`` slots
        kept), the rest pending.
    """
    kept = min(span.mem_len, start)
    evicted = start - kept
    memory = history[:, evicted:start]
    if span.cmem_len == 0:
        return memory, 0
    grouped = evicted // compressor.ratio * compressor.ratio
    slots = compress(compressor, history[:, :grouped]) if grouped else history[:, :0]
    slots = slots[:, max(0, slots.size(1) - span.cmem_len):]
    states = torch.cat([slots, history[:, grouped:evicted], memory], dim=1)
    return states, states.size(1) - kept


@dataclass
class SegmentOutput:
    """What :func:`read_segment` computes for one segment of T positions.

    Attributes:
        hidden: float [B, T, d_model], the last layer's output.
        layer_inputs: per layer, float [B, T, d_model]: ``h^{n-1}`` at the segment's positions.
        probs: per layer, float [B, H, T, S + T] over [states before, segment]; hidden keys get exactly 0.
        distances: int64 [T, S + T], key j's distance from query i in key slots (negative: the future).
    """

    hidden: torch.Tensor
    layer_inputs: list[torch.Tensor]
    probs: list[torch.Tensor]
    distances: torch.Tensor


@torch.no_grad()
def read_segment(model, input_ids: torch.Tensor, before: list[torch.Tensor] | None, leading: int = 0,
                 span: AttentionSpan | None = None) -> SegmentOutput:
    """One segment through every layer, each layer's keys reading ``before[n]`` then the segment.

    Args:
        model: :class:`~txl.model.TransformerXLLM` in eval mode (weights, embedding and output layers).
        input_ids: int64 [B, T].
        before: per layer, float [B, S, d_model]: the states the segment's keys read first, oldest first
            ([compressed, pending, memory] for a compressive reading); None or S = 0: no memory.
        leading: how many of the S states are compressed or pending (never hidden by ``same_length``).
        span: the :class:`~txl.model.AttentionSpan` (``same_length``, ``mem_len``, ``clamp_len``; None:
            the model's).

    Raises:
        TxlError: a model in training mode, or memory given to a vanilla (``abs``) model.
    """
    c = model.config
    span = c.span if span is None else span
    if model.training:
        raise TxlError("the reference computes evaluation mode only: call model.eval() first")
    emb = model.word_emb(input_ids)  # scaled by sqrt(d_model)
    n = emb.size(1)
    if before is None:
        before = [emb[:, :0]] * len(model.layers)
    if c.attn_type == "abs":
        if any(b.size(1) for b in before):
            raise TxlError("attn_type='abs' (vanilla Transformer) has no memory")
        h = emb + sinusoid_table(torch.arange(n, device=emb.device), c.d_model).to(emb.dtype)  # positions 0..T-1
    else:
        h = emb
    inputs, probs = [], []
    for layer, states in zip(model.layers, before):
        m = states.size(1)
        dist = key_distances(n, m, emb.device)
        hidden = dist < 0  # the future
        if span.same_length and span.mem_len > 0 and c.attn_type != "abs":  # keys mem_len or more back, but
            # not the compressed and pending slots; the vanilla model reads its segment alone, causally
            hidden = hidden | ((dist >= span.mem_len) & (torch.arange(m + n, device=emb.device)[None, :] >= leading))
        inputs.append(h)
        h, p = attention(layer.attn, h, states, dist, hidden, attn_type=c.attn_type, clamp_len=span.clamp_len,
                         d_model=c.d_model)
        h = feed_forward(layer.ff, h)
        probs.append(p)
    return SegmentOutput(h, inputs, probs, dist)


@torch.no_grad()
def forward(model, input_ids: torch.Tensor, lengths: list[int], span: AttentionSpan | None = None) -> ReferenceOutput:
    """Read ``input_ids`` in segments of ``lengths`` from an empty memory, the paper's way: each
    segment's memory rebuilt from the history of layer inputs (:func:`segment_keys`).

    Args:
        model: :class:`~txl.model.TransformerXLLM` in eval mode (its weights and embedding/output layers
            are used; its attention and memory code are not).
        input_ids: int64 [B, L]; lengths: segment lengths summing to L.
        span: the :class:`~txl.model.AttentionSpan` to read with (None: the model's).

    Returns:
        :class:`ReferenceOutput`.

    Raises:
        TxlError: lengths that do not sum to L, or a model in training mode.
    """
    c = model.config
    span = c.span if span is None else span
    if sum(lengths) != input_ids.size(1) or min(lengths, default=0) < 1:
        raise TxlError(f"segment lengths {lengths} must be positive and sum to the {input_ids.size(1)} tokens")
    history: list[list[torch.Tensor]] = [[] for _ in model.layers]  # per layer, per segment [B, T, d]
    logits, probs, distances, start = [], [], [], 0
    for n in lengths:
        before, leading = None, 0
        if c.attn_type != "abs" and start:
            built = [segment_keys(torch.cat(past, dim=1), start, span, layer.compress if span.cmem_len else None)
                     for past, layer in zip(history, model.layers)]
            before, leading = [b for b, _ in built], built[0][1]
        out = read_segment(model, input_ids[:, start:start + n], before, leading, span)
        for past, x in zip(history, out.layer_inputs):
            past.append(x)
        logits.append(model.crit.logits(out.hidden.reshape(-1, c.d_model)).view(out.hidden.size(0), n, -1))
        probs.append(out.probs)
        distances.append(out.distances)
        start += n
    return ReferenceOutput(torch.cat(logits, dim=1), [torch.cat(x, dim=1) for x in history], probs, distances)
