"""Position schemes: how attention knows where a key is, chosen by ``attn_type``.

Each scheme is one stateless object (:func:`position_scheme`); the attention layer, the model and the
decoding state ask it what they need and never compare ``attn_type`` themselves. What a scheme gives:

- ``memory``: whether the model keeps a memory. Segment-level recurrence (paper §3.2) needs scores
  that do not depend on where a segment starts: relative positions ("rel", "shaw") or positions that
  enter only as differences ("rope"); absolute positions added to the input ("abs") do not allow it.
- ``add_parameters``: its parameters, registered on the attention layer under the reference names
  (``r_net``, ``r_w_bias``/``r_r_bias``, ``r_emb``), so checkpoints do not depend on this module.
- ``embed``: positions added to the input (the vanilla Transformer only).
- ``segment``: the positional input of one call over K keys, built once for every layer: R for "rel"
  (the sinusoid of distances K-1 ... 0), the cos/sin of each key's position for "rope".
- ``rotate``: what happens to queries and new keys before the keys are kept ("rope" only).
- ``attend``: attention over [memory + segment] with the scheme's position term.
- ``step_*``: the one-token step of a decoding state: its position tables and the terms of its scores.

Shapes: B = batch, H = heads, T = queries, K = keys (memory + segment), D = ``d_head``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from txl.errors import TxlError
from txl.model.linear import Linear
from txl.model.attention import (biased_attention, padded_position_keys, relative_positions, shaw_distances,
                                 sinusoid)


class PositionScheme:
    """The interface (and the defaults) of a position scheme; see the module doc.

    Attributes:
        name: its ``attn_type``.
        memory: whether a model with it keeps a memory (and so may use a decoding state).
        keeps_scores: whether its attention forms [B, H, T, K] scores outside the fused kernel's
            causal path (the memory check before a call counts them).
    """

    name = ""
    memory = True
    keeps_scores = True

    def check(self, config) -> None:
        """Raise :class:`TxlError` for a config this scheme cannot serve (default: none)."""

    def check_clamp(self, clamp_len: int, flag: str = "clamp_len") -> None:
        """Raise :class:`TxlError` when the scheme cannot read with ``clamp_len`` (given as ``flag``; default: any)."""

    def layer_parameter_count(self, config) -> int:
        """Parameters of its own per layer (an upper bound, for the config's size check)."""
        return 0

    def add_parameters(self, attn: nn.Module, config, shared: tuple[nn.Parameter, nn.Parameter] | None) -> None:
        """Register its per-layer parameters on the attention module ``attn``."""

    def model_parameters(self, model: nn.Module, config) -> tuple[nn.Parameter, nn.Parameter] | None:
        """Register parameters shared by every layer on ``model``; returned to :meth:`add_parameters`."""
        return None

    def embed(self, emb: torch.Tensor) -> torch.Tensor:
        """The input [B, T, d_model] with positions added, if the scheme adds them there (default: as is)."""
        return emb

    def segment(self, config, klen: int, first: int, span, device, dtype, drop: nn.Module, caches=None):
        """The positional input of a call over ``klen`` keys whose first key is at text position
        ``first`` (the queries are the last T keys), handed to every layer; None when it needs none."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries [B, H, T, D] and the new keys [B, H, n, D] before the keys are kept (default: as is)."""
        return q, k

    def attend(self, attn: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions,
               mask: torch.Tensor, cache, window: int | None, dropout_p: float) -> torch.Tensor:
        """Attention output [B, H, T, D] of queries ``q`` [B, H, T, D] over keys and values [B, H, K, D];
        ``mask`` bool [T, K] or [B, 1, T, K], True = not visible; ``window`` as in
        :func:`~txl.model.attention.biased_attention`."""
        raise NotImplementedError

    def step_positions(self, state, config, device, dtype):
        """Before a one-token step: build what the step's layers need (the state keeps what lasts,
        ``state.pos_emb``); returned to every layer's step."""
        return None

    def step_rotate(self, q: torch.Tensor, k: torch.Tensor, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """A step's query and key [B, H, D] before the key is kept (default: as is)."""
        return q, k

    def step_terms(self, attn: nn.Module, q: torch.Tensor, cache, klen: int):
        """What :func:`~txl.model.attention.one_query_attention` takes for a step's query [B, H, D] over
        the ``klen`` slots of ``cache`` (slot order): the content and position queries, both scaled, the
        position keys and their ``columns`` (None, None, None, None without a position term)."""
        raise NotImplementedError


class _DistanceTable(PositionScheme):
    """A position key per distance, added to the keys as a score bias (what "rel" and "shaw" share).

    The one-token step reads its table of distances rotated to the ring buffer's order
    (:meth:`~txl.model.decoding.DecodingState.pos_offset`): a key does not depend on its position,
    so a slot keeps its key whatever distance it comes to hold.
    """

    def position_keys(self, attn: nn.Module, state) -> torch.Tensor:
        """[H, D, S]: the position keys for distances S-1 ... 0, S = ``state.capacity``."""
        raise NotImplementedError

    def step_queries(self, attn: nn.Module, q: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's queries for the content and the position term, both scaled: [B, H, D] each."""
        q = q * attn.scale
        return q, q

    def step_terms(self, attn, q, cache, klen):
        # scaled before the products (as the fused kernel does), so that half-precision scores stay in range
        q_c, q_r = self.step_queries(attn, q, cache)
        if cache.columns is not None:  # a ring: its table of distances, and the column of each slot's
            return q_c, q_r, cache.pos_keys, cache.columns
        state = cache.state
        if cache.pos_keys is None:  # distances S-1 ... 0, twice in a row (see LayerCache)
            r_k = self.position_keys(attn, state)
            cache.pos_keys = torch.cat([r_k, r_k], dim=-1).to(q.dtype).contiguous()
        off = state.pos_offset(klen)
        return q_c, q_r, cache.pos_keys[:, :, off:off + klen], None  # [H, D, K]: slot s's distance in column s


class Relative(_DistanceTable):
    """Transformer-XL's relative positions (paper §3.3), ``attn_type="rel"``.

    ``A_ij = (q_i + u)·k_j + (q_i + v)·W_kR R_{i-j}``, scaled by ``1/sqrt(D)``: R the sinusoid of
    distances (built once per call, dropout applied as the reference does), ``W_kR`` each layer's
    ``r_net``, u = ``r_w_bias`` and v = ``r_r_bias`` [H, D] shared by the layers or, with
    ``untie_r``, each layer's own. ``clamp_len`` caps the distances given to R.
    """

    name = "rel"

    def layer_parameter_count(self, config) -> int:
        heads = config.n_head * config.d_head
        return heads * config.d_model + 2 * heads  # r_net and per-layer u/v (counted whether untied or not)

    def model_parameters(self, model, config):
        if config.untie_r:
            return None
        model.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        model.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        return model.r_w_bias, model.r_r_bias

    def add_parameters(self, attn, config, shared):
        attn.r_net = Linear(config.d_model, config.n_head * config.d_head, bias=False)
        if config.untie_r:
            attn.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            attn.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        elif shared is None:
            raise TxlError("attn_type='rel' without own biases needs shared_biases (u, v)")
        else:
            attn.r_w_bias, attn.r_r_bias = shared  # tied: the same Parameter objects

    def segment(self, config, klen, first, span, device, dtype, drop, caches=None):
        if caches is not None and caches.segment_klen == klen:
            return None  # each layer of the decoding state keeps its projected positions for this key length
        if caches is not None:  # valid again once every layer holds this key length's positions
            caches.segment_klen = -1
        return drop(sinusoid(relative_positions(klen, span.clamp_len, device), config.d_model).to(dtype))

    def attend(self, attn, q, k, v, positions, mask, cache, window, dropout_p):
        klen = k.size(2)
        if positions is None:  # a decoding state's layer: the positions of this key length are kept
            r_k = cache.segment_pos_keys
        else:
            r_k = attn.r_net(positions).view(klen, attn.n_head, attn.d_head).permute(1, 2, 0)  # [H, D, K]
            if cache is not None:  # padded and contiguous once, not a strided copy per segment
                r_k = cache.segment_pos_keys = padded_position_keys(r_k)
        # (b) + (d), pre-scaled, realigned and masked, becomes an additive bias of the fused kernel,
        # which computes softmax(scale * (q + u)·k + bias) @ v, i.e. (a) + (c) + (b) + (d)
        u, vb = attn.r_w_bias, attn.r_r_bias
        return biased_attention(q + u[:, None, :], (q + vb[:, None, :]) * attn.scale, k, v, r_k, mask,
                                scale=attn.scale, dropout_p=dropout_p, window=window)

    def step_positions(self, state, config, device, dtype):
        if state.pos_emb is None:  # R of the ring's distances, projected by each layer on its first step
            state.pos_emb = sinusoid(relative_positions(state.capacity, state.span.clamp_len, device),
                                     config.d_model).to(dtype)
        return None

    def position_keys(self, attn, state):
        return attn.r_net(state.pos_emb).view(state.capacity, attn.n_head, attn.d_head).permute(1, 2, 0)

    def step_queries(self, attn, q, cache):
        if cache.query_biases is None:  # u and v times the scale, once per state: q_c = (q + u) * scale in one op
            cache.query_biases = torch.stack([attn.r_w_bias, attn.r_r_bias]).to(q.dtype) * attn.scale
        u, vb = cache.query_biases
        return torch.add(u, q, alpha=attn.scale), torch.add(vb, q, alpha=attn.scale)


class Shaw(_DistanceTable):
    """Shaw et al. (2018) learned relative positions, ``attn_type="shaw"`` (the paper's Table 6 comparison).

    ``A_ij = (q_i·k_j + q_i·a_{min(i-j, max_dist)}) / sqrt(D)``: terms (a) and (b) only, ``a`` a learned
    table ``r_emb`` [shaw_max_dist + 1, H, D] of each layer, no u, v. Distances count over
    [memory + current], so it works with memory exactly like "rel".
    """

    name = "shaw"

    def check(self, config) -> None:
        if config.shaw_max_dist < 1:
            raise TxlError(f"model.attn_type='shaw' needs model.shaw_max_dist >= 1 (the clipping distance, e.g. "
                           f"tgt_len + mem_len - 1), got {config.shaw_max_dist}")

    def layer_parameter_count(self, config) -> int:
        return (config.shaw_max_dist + 1) * config.n_head * config.d_head

    def add_parameters(self, attn, config, shared):
        if config.shaw_max_dist < 1:
            raise TxlError(f"attn_type='shaw' needs shaw_max_dist >= 1, got {config.shaw_max_dist}")
        attn.max_dist = config.shaw_max_dist
        attn.r_emb = nn.Parameter(torch.empty(config.shaw_max_dist + 1, config.n_head, config.d_head))

    def attend(self, attn, q, k, v, positions, mask, cache, window, dropout_p):
        # the learned a_d for distances K-1 ... 0 (clipped), then the same realignment as "rel":
        # (b) = q·a becomes the additive bias, the kernel adds (a) = q·k
        r_k = attn.r_emb[shaw_distances(k.size(2), attn.max_dist, q.device)].permute(1, 2, 0)  # [H, D, K]
        return biased_attention(q, q * attn.scale, k, v, r_k.to(q.dtype), mask, scale=attn.scale,
                                dropout_p=dropout_p, window=window)

    def position_keys(self, attn, state):
        return attn.r_emb[shaw_distances(state.capacity, attn.max_dist, attn.r_emb.device)].permute(1, 2, 0)


class Absolute(PositionScheme):
    """The vanilla Transformer's positions, ``attn_type="abs"`` (paper §3.1): the sinusoid of positions
    0 .. T-1 added to the scaled embedding, ``A_ij = q_i·k_j / sqrt(D)``, causal within the segment. A
    segment's positions restart at 0, so the model keeps no memory."""

    name = "abs"
    memory = False
    keeps_scores = False

    def embed(self, emb):
        return emb + sinusoid(torch.arange(emb.size(1), device=emb.device), emb.size(-1)).to(emb.dtype)

    def attend(self, attn, q, k, v, positions, mask, cache, window, dropout_p):
        # no memory and no padding: the mask is the causal one, and the kernel skips its blocks
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=attn.scale)


def rotary_frequencies(d_head: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``θ_f = 10000^(-2f/D)`` for f = 0 .. D/2 - 1 (float64 [D/2]; Su et al. 2021, eq. 15)."""
    return 1.0 / (10000.0 ** (torch.arange(0, d_head, 2, dtype=torch.float64, device=device) / d_head))


def rotary_angles(positions: torch.Tensor, d_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``p θ_f`` (float64 [N, D/2] each) for int64 positions ``p`` [N]. Computed in
    float64, so that a position in the millions keeps its angle to float32 precision."""
    angles = positions.to(torch.float64)[:, None] * rotary_frequencies(d_head, positions.device)[None, :]
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
    in the text (``DecodingState.seen``), before it enters the ring buffer, and each query at its own.
    The ring buffer is exact for the same reason as for "rel": the score of the query at p with the
    key in slot s depends on ``p - p_s`` only, and slot s keeps its key (and ``p_s``) until it is
    overwritten; no key is ever rotated again, whatever slot order the ring has reached.

    ``clamp_len`` has no meaning here (refused); ``d_head`` must be even.
    """

    name = "rope"

    def check(self, config) -> None:
        if config.d_head % 2:
            raise TxlError(f"model.attn_type='rope' needs an even model.d_head (pairs of dimensions rotate), got "
                           f"{config.d_head}")
        self.check_clamp(config.clamp_len, "model.clamp_len")

    def check_clamp(self, clamp_len, flag="clamp_len"):
        if clamp_len:
            raise TxlError(f"{flag}={clamp_len} has no meaning with attn_type='rope' (rotations of every distance); "
                           "set it to 0")

    def segment(self, config, klen, first, span, device, dtype, drop, caches=None):
        self.check_clamp(span.clamp_len)
        cos, sin = rotary_angles(torch.arange(first, first + klen, device=device), config.d_head)
        return cos.to(dtype), sin.to(dtype)

    def rotate(self, q, k, positions):
        cos, sin = (t.to(q.dtype) for t in positions)  # (the keys' dtype, autocast's included)
        return (rotate_half(q, cos[-q.size(2):], sin[-q.size(2):]),
                rotate_half(k, cos[-k.size(2):], sin[-k.size(2):]))

    def attend(self, attn, q, k, v, positions, mask, cache, window, dropout_p):
        if mask.dim() == 2 and k.size(2) == q.size(2) and window == 0:  # no memory, no padding: causal
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, scale=attn.scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, dropout_p=dropout_p, scale=attn.scale)

    def step_positions(self, state, config, device, dtype):
        if state.pos_emb is None:  # θ (float64 [D/2]) kept by the state: a step multiplies it by its position
            state.pos_emb = rotary_frequencies(config.d_head, device)
        angles = state.pos_emb * float(state.seen)  # (no host-to-device copy of the position)
        return angles.cos(), angles.sin()

    def step_rotate(self, q, k, positions):
        cos, sin = (t.to(q.dtype) for t in positions)
        both = rotate_half(torch.stack([q, k], 1), cos, sin)  # [B, 2, H, D]: one rotation for both
        return both[:, 0], both[:, 1]

    def step_terms(self, attn, q, cache, klen):
        return q * attn.scale, None, None, None


SCHEMES: dict[str, PositionScheme] = {s.name: s for s in (Relative(), Shaw(), Absolute(), Rotary())}


def position_scheme(attn_type: str) -> PositionScheme:
    """The scheme of ``attn_type`` ("rel", "shaw", "abs" or "rope").

    Raises:
        TxlError: an unknown ``attn_type``.
    """
    try:
        return SCHEMES[attn_type]
    except (KeyError, TypeError):
        raise TxlError(f"model.attn_type must be one of {', '.join(SCHEMES)}, got {attn_type!r}") from None
