"""Compressive memory: the Compressive Transformer's second memory (Rae et al. 2019, §3, Algorithms 1-2).

With ``cmem_len > 0`` the states leaving a layer's memory are compressed, ``c = cmem_ratio`` at a time,
by the layer's f_c (:class:`Compressor`); each layer keeps its newest ``cmem_len`` compressed slots, and
attention reads [compressed, pending, memory, segment] with distances counted in key slots. States that
left the memory but do not fill a group of c yet wait, visible, as pending states (fewer than c). The
memory (``mems`` in and out of :meth:`txl.model.TransformerXLLM.forward`) is a flat list of
``3 * n_layer`` tensors, so everything that moves memory rows handles it as the plain memory::

    mems[0 : n_layer]            memory          [B, M, d_model]  (M <= mem_len, oldest first)
    mems[n_layer : 2 * n_layer]  compressed      [B, C, d_model]  (C <= cmem_len, oldest first)
    mems[2 * n_layer : 3 * n]    pending         [B, P, d_model]  (P < cmem_ratio, oldest first)

Everything carried on is detached; the compression network learns from the attention-reconstruction
loss alone (:func:`reconstruction_loss`). Why pending states and slot distances: docs/compressive.md.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from txl.errors import TxlError
from txl.kernels.cpu import Linear, product
from txl.model.memory import Mems, check_mems


class Compressor(nn.Module):
    """The compression function f_c of one layer: [B, n * c, d] states -> [B, n, d] compressed slots.

    ``kind`` "conv1d": a 1-D convolution with kernel size and stride c over time (parameters
    ``weight`` [d, d, c], ``bias`` [d]; the paper's best function, §3.1, Table 2); "max_pool",
    "mean_pool": max / mean over each group of c (no parameters). ``kind`` and ``ratio`` are a checked
    config's (:meth:`~txl.model.TransformerXLConfig.check`).
    """

    param_kinds = {"weight": "linear", "bias": "bias"}

    def __init__(self, d_model: int, ratio: int, kind: str) -> None:
        super().__init__()
        self.ratio, self.kind = ratio, kind
        if kind == "conv1d":
            self.weight = nn.Parameter(torch.empty(d_model, d_model, ratio))
            self.bias = nn.Parameter(torch.empty(d_model))

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """[B, n * c, d] (float) -> [B, n, d]: slot k compresses states ``k*c .. k*c + c - 1``."""
        x = states.transpose(1, 2)  # [B, d, n*c]
        if self.kind == "conv1d":
            y = F.conv1d(x, self.weight.to(x.dtype), self.bias.to(x.dtype), stride=self.ratio)
        elif self.kind == "max_pool":
            y = F.max_pool1d(x, self.ratio, self.ratio)
        else:
            y = F.avg_pool1d(x, self.ratio, self.ratio)
        return y.transpose(1, 2)


def split_mems(mems: Mems | None, n_layer: int) -> tuple[Mems | None, Mems | None, Mems | None]:
    """``(memory, compressed, pending)``: the three ``n_layer``-lists of a compressive ``mems``.

    A plain list of ``n_layer`` tensors is read as a memory with no compressed or pending states
    (e.g. a Transformer-XL memory handed to a compressive reading); None gives three Nones.
    The lists are not checked here (see :func:`check_compressive_mems`).
    """
    if mems is None:
        return None, None, None
    if isinstance(mems, (list, tuple)) and len(mems) == n_layer:
        return list(mems), None, None
    return list(mems[:n_layer]), list(mems[n_layer:2 * n_layer]), list(mems[2 * n_layer:])


def check_compressive_mems(mems: Mems | None, n_layer: int, batch_size: int, d_model: int, ratio: int, *,
                           dtypes: tuple[torch.dtype, ...] | None = None,
                           device: torch.device | None = None) -> tuple[int, int, int]:
    """Check a compressive memory and return its lengths ``(M, C, P)`` (zeros for None).

    Args:
        mems: None, ``3 * n_layer`` tensors in the layout of this module, or ``n_layer`` tensors
            (a plain memory: C = P = 0).
        ratio: the model's ``cmem_ratio`` (P must be below it).
        n_layer, batch_size, d_model, dtypes, device: as :func:`txl.model.memory.check_mems`.

    Raises:
        TxlError: another number of tensors, any check of :func:`~txl.model.memory.check_mems` on
            one of the three parts, or ``P >= ratio``.
    """
    if mems is None:
        return 0, 0, 0
    if not isinstance(mems, (list, tuple)) or len(mems) not in (n_layer, 3 * n_layer):
        got = len(mems) if isinstance(mems, (list, tuple)) else type(mems).__name__
        raise TxlError(f"a compressive memory (cmem_len > 0) is a list of 3 × {n_layer} tensors (memory, compressed "
                       f"memory, pending states per layer) or {n_layer} tensors (memory only), got {got}")
    memory, compressed, pending = split_mems(mems, n_layer)
    lengths = [check_mems(memory, n_layer, batch_size, d_model, dtypes=dtypes, device=device)]
    for part in (compressed, pending):
        lengths.append(0 if part is None else check_mems(part, n_layer, batch_size, d_model, dtypes=dtypes,
                                                        device=device))
    if lengths[2] >= ratio:
        raise TxlError(f"the compressive memory holds {lengths[2]} pending states per layer; fewer than "
                       f"cmem_ratio = {ratio} are possible: pass the mems returned by the previous call")
    return lengths[0], lengths[1], lengths[2]


def layer_memory(memory: Mems | None, compressed: Mems | None, pending: Mems | None, i: int) -> torch.Tensor | None:
    """Layer ``i``'s keys before the segment, oldest first: [B, C + P + M, d] = [compressed, pending, memory]."""
    parts = [p[i] for p in (compressed, pending, memory) if p is not None and p[i].size(1) > 0]
    if not parts:
        return None if memory is None else memory[i]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def update_compressive(memory: Mems | None, compressed: Mems | None, pending: Mems | None, hids: Mems, *,
                       mem_len: int, cmem_len: int, compressors: list[Compressor], detach: bool = True,
                       attentions: list[nn.Module] | None = None) -> tuple[Mems, torch.Tensor | None]:
    """The next compressive memory after a segment, and the attention-reconstruction loss (Algorithm 1).

    Per layer: the memory becomes the last ``mem_len`` of [memory, segment inputs]; the states that
    leave it join ``pending``; every full group of c (oldest first) is compressed into one slot; the
    compressed memory keeps the newest ``cmem_len`` slots of [compressed, new slots]; the rest of
    ``pending`` (< c states) waits.

    Args:
        memory, compressed, pending: the parts of the memory the segment was read with (see
            :func:`split_mems`; None for empty parts).
        hids: ``n_layer`` tensors [B, T, d], each layer's input for the segment.
        mem_len, cmem_len: lengths to keep (tokens, slots); ``cmem_len >= 1``.
        compressors: each layer's :class:`Compressor`.
        detach: True: the new memory is detached (stop-gradient, paper §3.2 of Dai et al.).
            False: memory and compressed memory keep the graph (truncated BPTT).
        attentions: each layer's :class:`~txl.model.attention.MultiHeadAttention`; given (and with
            autograd enabled) the reconstruction loss is computed, summed over layers.

    Returns:
        ``(mems, recon)``: the ``3 * n_layer`` tensors of the new memory (module docstring), and
        the reconstruction loss (float scalar; None when ``attentions`` is None or autograd is off).
    """
    new_memory, new_compressed, new_pending = [], [], []
    recon = None
    want_recon = attentions is not None and torch.is_grad_enabled()
    for i, h in enumerate(hids):
        cat = h if memory is None else torch.cat([memory[i], h], dim=1)
        cut = max(0, cat.size(1) - mem_len)
        queue = cat[:, :cut]  # the states leaving the memory, oldest first
        if pending is not None:
            queue = torch.cat([pending[i], queue], dim=1)
        n = queue.size(1) // compressors[i].ratio * compressors[i].ratio
        groups, waiting = queue[:, :n], queue[:, n:]
        with torch.no_grad() if detach and not want_recon else contextlib.nullcontext():
            slots = compressors[i](groups.detach() if detach else groups) if n else queue[:, :0]
        if want_recon:
            term = reconstruction_loss(attentions[i], h, groups, slots) if n else _zero_like_params(compressors[i], h)
            recon = term if recon is None else recon + term
        old = queue[:, :0] if compressed is None else compressed[i]
        joined = torch.cat([old, slots], dim=1)
        joined = joined[:, max(0, joined.size(1) - cmem_len):]
        for out, t in ((new_memory, cat[:, cut:]), (new_compressed, joined), (new_pending, waiting)):
            out.append(t.detach().contiguous() if detach else t)
    return new_memory + new_compressed + new_pending, recon


def _zero_like_params(compressor: Compressor, like: torch.Tensor) -> torch.Tensor:
    """A zero loss joined to the compressor's parameters (so every parameter gets a gradient, as
    DistributedDataParallel expects, even in a step that compressed nothing)."""
    params = list(compressor.parameters())
    if not params:
        return like.new_zeros(())
    return sum(p.sum() for p in params).to(like.dtype) * 0.0


def content_attention(attn: nn.Module, h: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """The layer's content-based attention of queries from ``h`` over ``states``, with detached weights.

    ``softmax((x W_q)(s W_k)^T / sqrt(d_head)) (s W_v)`` per head, heads concatenated, where x and s
    are ``h`` and ``states`` (after the layer's LayerNorm with ``pre_lnorm``). No positions and no
    mask: every state is older than every query. The attention parameters are detached (paper §3.2,
    Algorithm 2: "stop_gradient" on the layer's Q, K, V).

    Args:
        attn: a :class:`~txl.model.attention.MultiHeadAttention`.
        h: [B, T, d] queries' inputs; states: [B, S, d] (S >= 1).

    Returns:
        float [B, T, n_head * d_head].
    """
    hd = attn.n_head * attn.d_head
    qkv = attn.qkv_net

    def project(x, rows):  # (an int8 layer has no parameters: nothing to detach)
        return product(x, qkv.weight.detach()[rows]) if isinstance(qkv, Linear) else qkv(x, rows)

    ln = attn.layer_norm

    def norm(x):
        if not attn.pre_lnorm:
            return x
        return F.layer_norm(x, ln.normalized_shape, ln.weight.detach(), ln.bias.detach(), ln.eps)

    q = attn._heads(project(norm(h), slice(0, hd)))
    k, v = (attn._heads(t) for t in project(norm(states), slice(hd, None)).split(hd, dim=-1))
    out = F.scaled_dot_product_attention(q, k, v, scale=attn.scale)  # [B, H, T, D]
    return out.transpose(1, 2).reshape(h.size(0), h.size(1), hd)


def reconstruction_loss(attn: nn.Module, h: torch.Tensor, old: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The attention-reconstruction loss of one layer (Rae et al. 2019, §3.2, Algorithm 2).

    ``mean((attn(h, old) - attn(h, slots))^2)`` over batch, queries and features, with
    :func:`content_attention`. ``h`` and ``old`` are detached, so only the compression network that
    produced ``slots`` (from ``old``) receives a gradient.

    Args:
        attn: the layer's attention module; h: [B, T, d] the layer's inputs for the segment;
        old: [B, n * c, d] the states that were compressed; slots: [B, n, d] their compression.

    Returns:
        float scalar tensor (squared units of the layer's attention output).
    """
    h, old = h.detach(), old.detach()
    with torch.no_grad():
        target = content_attention(attn, h, old)
    return F.mse_loss(content_attention(attn, h, slots), target)
