"""Position schemes: how attention knows where a key is, chosen by ``attn_type``.

A scheme is an ``nn.Module``, one per attention layer, that owns that layer's position parameters and
is handed to the attention (:class:`~txl.model.attention.MultiHeadAttention` holds it as ``pos``); the
attention, the model and the decoding state ask it what they need and never compare ``attn_type``
themselves. What a call builds once for every layer is a class method (``embed``, ``segment``,
``step_positions``); what a layer does with its parameters is a method (``rotate``, ``attend``, and
``step_rotate``, ``step_attend`` for the one-token step). What a scheme asks of a config is
:mod:`txl.config.model`'s.

Parameter names follow the reference implementation under the layer's ``attn.pos``: ``r_net`` (W_kR),
``r_w_bias``/``r_r_bias`` (u, v; shared by the layers unless ``untie_r``), ``r_emb`` (Shaw's tables);
checkpoints with them directly on the attention load too (:func:`txl.fileio.model_files.current_name`).

Shapes: B = batch, H = heads, T = queries, K = keys (memory + segment), D = ``d_head``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from txl.config import check_clamp
from txl.errors import TxlError
from txl.kernels.cpu import Linear
from txl.model.attention import biased_attention, inverse_frequencies, one_query_attention, relative_positions, sinusoid


class PositionScheme(nn.Module):
    """The interface (and the defaults) of a position scheme; see the module doc.

    Attributes:
        name: its ``attn_type``.
        keeps_scores: whether its attention forms [B, H, T, K] scores outside the fused kernel's
            causal path (the memory check before a reading counts them).
        scale: ``1/sqrt(d_head)``, the scores' scale.

    Args:
        config: the model's :class:`~txl.model.TransformerXLConfig`.
        shared: the model's u and v for "rel" without ``untie_r`` (:meth:`shared_parameters`), else None.
    """

    name = ""
    keeps_scores = True

    def __init__(self, config, shared: tuple[nn.Parameter, nn.Parameter] | None = None) -> None:
        super().__init__()
        self.n_head, self.d_head, self.scale = config.n_head, config.d_head, 1.0 / math.sqrt(config.d_head)

    @classmethod
    def shared_parameters(cls, config) -> tuple[nn.Parameter, nn.Parameter] | None:
        """Parameters every layer shares, made once by the model and handed to each layer's scheme."""
        return None

    @classmethod
    def embed(cls, emb: torch.Tensor) -> torch.Tensor:
        """The input [B, T, d_model] with positions added, if the scheme adds them there (default: as is)."""
        return emb

    @classmethod
    def segment(cls, config, klen: int, first: int, span, device, dtype, drop: nn.Module, caches=None):
        """The positional input of a call over ``klen`` keys whose first key is at text position
        ``first`` (the queries are the last T keys), handed to every layer; None when it needs none."""
        return None

    @classmethod
    def step_positions(cls, state, config, device, dtype):
        """Before a one-token step: build what the step's layers need (the state keeps what lasts,
        ``state.pos_emb``); returned to every layer's step."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries [B, H, T, D] and the new keys [B, H, n, D] before the keys are kept (default: as is)."""
        return q, k

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions, mask: torch.Tensor, cache,
               dropout_p: float) -> torch.Tensor:
        """Attention output [B, H, T, D] of queries ``q`` [B, H, T, D] over keys and values [B, H, K, D];
        ``mask`` bool [T, K] or [B, 1, T, K], True = not visible."""
        raise NotImplementedError

    def step_rotate(self, q: torch.Tensor, k: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's query and key [B, H, D] before the key is kept (default: as is)."""
        return q, k

    def step_attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, cache,
                    key_mask: torch.Tensor | None) -> torch.Tensor:
        """A step's attention [B, H, 1, D] for its query [B, H, D] over the slots ``keys``/``values``
        [B, H, K, D] of ``cache`` (slot order): :func:`~txl.model.attention.one_query_attention` with the
        scheme's terms (default: no position term)."""
        return one_query_attention(q * self.scale, None, keys, values, None, key_mask, scale=1.0, own=cache.own)


class _DistanceTable(PositionScheme):
    """A position key per distance, added to the keys as a score bias (what "rel" and "shaw" share).

    The one-token step reads its table of distances rotated to the ring's order
    (:meth:`~txl.model.decoding.DecodingState.pos_offset`; why a ring is exact: :mod:`txl.model.decoding`).
    """

    def position_keys(self, state) -> torch.Tensor:
        """[H, D, S]: the position keys for distances S-1 ... 0, S = ``state.capacity``."""
        raise NotImplementedError

    def step_queries(self, q: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's queries for the content and the position term, both scaled: [B, H, D] each."""
        q = q * self.scale
        return q, q

    def step_attend(self, q, keys, values, cache, key_mask):
        # scaled before the products (as the fused kernel does), so that half-precision scores stay in range
        q_c, q_r = self.step_queries(q, cache)
        if cache.columns is not None:  # a ring: its table of distances, and the column of each slot's
            r_k, columns = cache.pos_keys, cache.columns
        else:
            state, klen = cache.state, keys.size(2)
            if cache.pos_keys is None:  # distances S-1 ... 0, twice in a row (see LayerCache)
                r_k = self.position_keys(state)
                cache.pos_keys = torch.cat([r_k, r_k], dim=-1).to(q.dtype).contiguous()
            off = state.pos_offset(klen)
            r_k, columns = cache.pos_keys[:, :, off:off + klen], None  # [H, D, K]: slot s's distance in column s
        return one_query_attention(q_c, q_r, keys, values, r_k, key_mask, scale=1.0, columns=columns,
                                   own=cache.own)  # (queries [B, H, D]: no unsqueeze per layer and step)


class Relative(_DistanceTable):
    """Transformer-XL's relative positions (paper §3.3), ``attn_type="rel"``.

    ``A_ij = (q_i + u)·k_j + (q_i + v)·W_kR R_{i-j}``, scaled by ``1/sqrt(D)``: R the sinusoid of
    distances (built once per call, dropout applied as the reference does), ``W_kR`` this layer's
    ``r_net``, u = ``r_w_bias`` and v = ``r_r_bias`` [H, D] shared by the layers or, with
    ``untie_r``, this layer's own. ``clamp_len`` caps the distances given to R.
    """

    name = "rel"
    param_kinds = {"r_w_bias": "position_bias", "r_r_bias": "position_bias"}  # see txl.model.parameters

    def __init__(self, config, shared=None) -> None:
        super().__init__(config)
        if shared is None and not config.untie_r:
            raise TxlError("attn_type='rel' without own biases needs shared_biases (u, v)")
        if config.untie_r:
            self.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            self.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        else:
            self.r_w_bias, self.r_r_bias = shared  # tied: the same Parameter objects
        self.r_net = Linear(config.d_model, config.n_head * config.d_head, bias=False)

    @classmethod
    def shared_parameters(cls, config):
        if config.untie_r:
            return None
        return (nn.Parameter(torch.empty(config.n_head, config.d_head)),
                nn.Parameter(torch.empty(config.n_head, config.d_head)))

    @classmethod
    def segment(cls, config, klen, first, span, device, dtype, drop, caches=None):
        if caches is not None and caches.segment_klen == klen:
            return None  # each layer of the decoding state keeps its projected positions for this key length
        if caches is not None:  # valid again once every layer holds this key length's positions
            caches.segment_klen = -1
        return drop(sinusoid(relative_positions(klen, span.clamp_len, device), config.d_model).to(dtype))

    def attend(self, q, k, v, positions, mask, cache, dropout_p):
        if positions is None:  # a decoding state's layer: the positions of this key length are kept
            r_k = cache.segment_pos_keys
        else:
            r_k = F.pad(self.project(positions), (1, 0))  # [H, D, K + 1]: a zero key for distance K in front
            if cache is not None:  # kept while the key length stays the same
                cache.segment_pos_keys = r_k
        # (b) + (d), pre-scaled, realigned and masked, becomes an additive bias of the fused kernel,
        # which computes softmax(scale * (q + u)·k + bias) @ v, i.e. (a) + (c) + (b) + (d)
        u, vb = self.r_w_bias, self.r_r_bias
        return biased_attention(q + u[:, None, :], (q + vb[:, None, :]) * self.scale, k, v, r_k, mask,
                                scale=self.scale, dropout_p=dropout_p)

    @classmethod
    def step_positions(cls, state, config, device, dtype):
        if state.pos_emb is None:  # R of the ring's distances, projected by each layer on its first step
            state.pos_emb = sinusoid(relative_positions(state.capacity, state.span.clamp_len, device),
                                     config.d_model).to(dtype)
        return None

    def project(self, R: torch.Tensor) -> torch.Tensor:
        """``W_kR R``: R [K, d_model] -> position keys [H, D, K]."""
        return self.r_net(R).view(R.size(0), self.n_head, self.d_head).permute(1, 2, 0)

    def position_keys(self, state):
        return self.project(state.pos_emb)

    def step_queries(self, q, cache):
        if cache.query_biases is None:  # u and v times the scale, once per state: q_c = (q + u) * scale in one op
            cache.query_biases = torch.stack([self.r_w_bias, self.r_r_bias]).to(q.dtype) * self.scale
        u, vb = cache.query_biases
        return torch.add(u, q, alpha=self.scale), torch.add(vb, q, alpha=self.scale)


class Shaw(_DistanceTable):
    """Shaw et al. (2018) learned relative positions, ``attn_type="shaw"`` (the paper's Table 6 comparison).

    ``A_ij = (q_i·k_j + q_i·a_{min(i-j, max_dist)}) / sqrt(D)``: terms (a) and (b) only, ``a`` a learned
    table ``r_emb`` [shaw_max_dist + 1, H, D] of each layer, no u, v. Distances count over
    [memory + current], so it works with memory exactly like "rel".
    """

    name = "shaw"
    param_kinds = {"r_emb": "position_table"}

    def __init__(self, config, shared=None) -> None:
        super().__init__(config)
        self.max_dist = config.shaw_max_dist
        self.r_emb = nn.Parameter(torch.empty(config.shaw_max_dist + 1, config.n_head, config.d_head))

    def attend(self, q, k, v, positions, mask, cache, dropout_p):
        # the learned a_d for distances K ... 0 (clipped), then the same realignment as "rel":
        # (b) = q·a becomes the additive bias, the kernel adds (a) = q·k
        return biased_attention(q, q * self.scale, k, v, self.table(k.size(2) + 1).to(q.dtype), mask,
                                scale=self.scale, dropout_p=dropout_p)

    def table(self, klen: int) -> torch.Tensor:
        """The learned a_d for distances klen-1 ... 0 (clipped at ``max_dist``): [H, D, klen]."""
        return self.r_emb[relative_positions(klen, self.max_dist, self.r_emb.device)].permute(1, 2, 0)

    def position_keys(self, state):
        return self.table(state.capacity)


class Absolute(PositionScheme):
    """The vanilla Transformer's positions, ``attn_type="abs"`` (paper §3.1): the sinusoid of positions
    0 .. T-1 added to the scaled embedding, ``A_ij = q_i·k_j / sqrt(D)``, causal within the segment. A
    segment's positions restart at 0, so the model keeps no memory."""

    name = "abs"
    keeps_scores = False

    @classmethod
    def embed(cls, emb):
        return emb + sinusoid(torch.arange(emb.size(1), device=emb.device), emb.size(-1)).to(emb.dtype)

    def attend(self, q, k, v, positions, mask, cache, dropout_p):
        # no memory and no padding: the mask is the causal one, and the kernel skips its blocks
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=self.scale)


def rotary_angles(positions: torch.Tensor, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``p θ_f`` (float64 [N, D/2] each) for int64 positions ``p`` [N]. Computed in
    float64, so that a position in the millions keeps its angle to float32 precision."""
    theta = inverse_frequencies(d_head, positions.device, torch.float64)
    angles = positions.to(torch.float64)[:, None] * theta[None, :]
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_f, x_{f + D/2}) of ``x`` [..., D] by the angle whose cos and sin are given
    ([..., D/2], broadcast against ``x``'s leading dims): ``(x1 cos - x2 sin, x1 sin + x2 cos)``."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Rotary(PositionScheme):
    """Rotary positions with the memory, ``attn_type="rope"`` (Su et al. 2021, RoFormer).

    Query i and key j are rotated by their positions before their product: ``A_ij = (R_{p_i} q_i)·(R_{p_j}
    k_j) / sqrt(D)``, R_p rotating the pairs (f, f + D/2) by ``p θ_f``. The product depends on
    ``p_i - p_j`` only, so scores are relative, and a memory works as with "rel": no parameters of
    its own, no position term beside the content one.

    Where the positions come from: a call over K keys gives them the positions ``first .. first + K - 1``,
    the queries the last T. Reading with a hidden-state memory (training, evaluation), the keys are
    rebuilt from the memory every segment and ``first`` is 0: positions count in the window (only
    differences matter). A decoding state keeps keys: each is rotated once, at its absolute position
    in the text (``DecodingState.seen``), before it enters the ring buffer, and each query at its own
    (why the ring is then exact: :mod:`txl.model.decoding`).

    ``clamp_len`` has no meaning here (refused); ``d_head`` must be even.
    """

    name = "rope"

    @classmethod
    def segment(cls, config, klen, first, span, device, dtype, drop, caches=None):
        check_clamp("rope", span.clamp_len)
        cos, sin = rotary_angles(torch.arange(first, first + klen, device=device), config.d_head)
        return cos.to(dtype), sin.to(dtype), span.same_length and span.mem_len > 0  # (a band beside the causal mask)

    def rotate(self, q, k, positions):
        cos, sin = (t.to(q.dtype) for t in positions[:2])  # (the keys' dtype, autocast's included)
        return (rotate_half(q, cos[-q.size(2):], sin[-q.size(2):]),
                rotate_half(k, cos[-k.size(2):], sin[-k.size(2):]))

    def attend(self, q, k, v, positions, mask, cache, dropout_p):
        if mask.dim() == 2 and k.size(2) == q.size(2) and not positions[2]:  # no memory, no padding, no band: causal
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=self.scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, dropout_p=dropout_p, scale=self.scale)

    @classmethod
    def step_positions(cls, state, config, device, dtype):
        if state.pos_emb is None:  # θ (float64 [D/2]) kept by the state: a step multiplies it by its position
            state.pos_emb = inverse_frequencies(config.d_head, device, torch.float64)
        angles = state.pos_emb * float(state.seen)  # (no host-to-device copy of the position)
        return angles.cos(), angles.sin()

    def step_rotate(self, q, k, positions):
        cos, sin = (t.to(q.dtype) for t in positions)
        both = rotate_half(torch.stack([q, k], 1), cos, sin)  # [B, 2, H, D]: one rotation for both
        return both[:, 0], both[:, 1]


# attn_type -> its scheme's class, for the names a checked config allows (txl.config.check_position_scheme)
SCHEMES: dict[str, type[PositionScheme]] = {s.name: s for s in (Relative, Shaw, Absolute, Rotary)}
