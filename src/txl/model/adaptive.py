"""Adaptive input embeddings and the projected adaptive softmax for large vocabularies.

Sources: Grave et al. 2017, "Efficient softmax approximation for GPUs" (two-level softmax: a head
over a frequent-word shortlist plus one logit per tail cluster); Baevski & Auli 2019, "Adaptive
input representations" (cluster i uses dimension ``d_embed // div_val**i``, projected to the model
width); Dai et al. 2019, Transformer-XL, appendix (both combined, optionally tied).

Token ids are split into clusters by ``cutoffs``: cluster i covers ids ``[c_i, c_{i+1})`` with
``c_0 = 0`` and the last boundary ``vocab_size``. The loss path never builds an ``[N, vocab]``
tensor: it computes the head logits ``[N, cutoffs[0] + n_tail]`` and, per tail cluster, logits only
for the rows whose label falls in that cluster.

Parameter names are Hugging Face ``transformers`` 4.35.2's (``emb_layers``, ``emb_projs``,
``out_layers``, ``out_projs``, ``cluster_weight``, ``cluster_bias``), and the head's cluster logits
are in its natural order (tail cluster i at head column ``cutoffs[0] + i - 1``), so its checkpoints
convert without reordering. The authors' PyTorch code reverses that order (tail cluster i reads row
``K - i``): a converter reading its checkpoints must reverse the rows of ``cluster_weight`` and
``cluster_bias``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from txl.config import IGNORE_INDEX
from txl.errors import TxlError
from txl.kernels.cpu import Linear, product
from txl.model.parameters import init_weights
from txl.runtime import reads_values


def _configure(module: nn.Module, vocab_size: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int) -> None:
    """Check the adaptive configuration and keep it on ``module``, with ``bounds = [0, *cutoffs, vocab_size]``."""
    if vocab_size < 1 or d_embed < 1 or d_proj < 1:
        raise TxlError(f"vocab_size, d_embed and d_proj must be >= 1, got {vocab_size}, {d_embed}, {d_proj}")
    if not isinstance(div_val, int) or div_val < 1:
        raise TxlError(f"div_val must be an integer >= 1, got {div_val!r}")
    bounds = [0, *cutoffs, vocab_size]
    if any(not isinstance(c, int) for c in cutoffs) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise TxlError(f"cutoffs must be strictly increasing integers in (0, vocab_size={vocab_size}), "
                       f"got {list(cutoffs)}")
    if div_val > 1 and d_embed // div_val ** len(cutoffs) < 1:
        raise TxlError(f"d_embed={d_embed} is too small for div_val={div_val} with {len(cutoffs) + 1} "
                       f"clusters: the last cluster would have dimension 0")
    module.bounds, module.cutoffs = bounds, list(cutoffs)
    module.vocab_size, module.d_embed, module.d_proj, module.div_val = vocab_size, d_embed, d_proj, div_val


class AdaptiveEmbedding(nn.Module):
    """Adaptive input embedding (Baevski & Auli 2019), scaled by ``sqrt(d_proj)``.

    Args:
        vocab_size: number of token ids V.
        d_embed: embedding dimension of the first (most frequent) cluster.
        d_proj: output dimension (the model width).
        cutoffs: cluster boundaries below V, strictly increasing; ``[]`` means one cluster.
        div_val: cluster i has dimension ``d_embed // div_val**i``; 1 means one shared table.
        init_std / proj_init_std: std of the normal init of tables / projections (by
            :func:`txl.model.parameters.init_weights`; the language model passes its config's values).

    Parameters (HF names): ``emb_layers[i]`` an ``nn.Embedding``; ``emb_projs[i]`` ``[d_proj, d_i]``.
    With ``div_val == 1`` there is one table ``[V, d_embed]`` and a projection only when
    ``d_proj != d_embed``; with ``div_val > 1`` every cluster has a table and a projection.

    Raises:
        TxlError: bad cutoffs, ``div_val < 1``, or dimensions that would reach 0.
    """

    param_kinds = {"emb_projs": "projection"}  # see txl.model.parameters

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int = 1,
                 init_std: float = 0.02, proj_init_std: float = 0.01):
        super().__init__()
        _configure(self, vocab_size, d_embed, d_proj, list(cutoffs), div_val)
        self.emb_scale = d_proj ** 0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(vocab_size, d_embed))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:])):
                d_i = d_embed // div_val ** i
                self.emb_layers.append(nn.Embedding(hi - lo, d_i))
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_i)))
        init_weights(self, init_std, proj_init_std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Embed ``ids`` (LongTensor, any shape ``[...]``) -> ``[..., d_proj]``.

        The dtype is that of the (projected) embeddings: the parameter dtype, or the autocast dtype
        when a projection runs under ``torch.autocast``.
        """
        if self.div_val == 1:
            emb = self.emb_layers[0](ids)
            if len(self.emb_projs) > 0:
                emb = F.linear(emb, self.emb_projs[0])  # [..., d_embed] -> [..., d_proj]
            return emb * self.emb_scale

        flat = ids.reshape(-1)
        # every cluster embeds every token, masked: no data-dependent shapes (nothing to read back from an
        # accelerator, one graph under torch.compile) for a few [N, d_proj] products more, a small part of a
        # step beside the layers and the softmax
        out = None
        for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:])):
            inside = ((flat >= lo) & (flat < hi)).unsqueeze(1)
            chunk = F.linear(self.emb_layers[i]((flat - lo).clamp(0, hi - lo - 1)), self.emb_projs[i])
            out = torch.where(inside, chunk, 0.0 if out is None else out)
        return out.view(*ids.shape, self.d_proj) * self.emb_scale


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Projected adaptive softmax (Grave et al. 2017; Transformer-XL appendix).

    p(y | h) = p_head(y) for y in the shortlist ``[0, cutoffs[0])``, else
    p_head(cluster i) * p_i(y | cluster i). The head has ``cutoffs[0] + K`` outputs, the last K
    being tail clusters 1..K in natural order (see the module docstring for the authors' reversed order).

    Args: as :class:`AdaptiveEmbedding` (``d_proj`` is the width of the incoming hidden states).

    Parameters (HF names): ``out_layers[i]`` ``nn.Linear(d_i, size_i)`` (``div_val == 1``: one
    ``Linear(d_embed, V)`` whose row slices serve all clusters); ``out_projs[i]`` ``[d_proj, d_i]``
    (``div_val == 1``: one per cluster, only when ``d_proj != d_embed``); with cutoffs,
    ``cluster_weight`` ``[K, d_embed]`` and ``cluster_bias`` ``[K]``, K = ``len(cutoffs)``.

    Log-softmax runs in float32 even under bf16/fp16 autocast; results are float32 (float64 when
    the module and inputs are float64). Units are nats.

    Raises:
        TxlError: bad configuration (as :class:`AdaptiveEmbedding`); bad shapes or labels in calls.
    """

    # Output tables are output embeddings (tied or not); see txl.model.parameters.
    param_kinds = {"out_layers": "embedding", "out_projs": "projection", "cluster_weight": "embedding",
                   "cluster_bias": "bias"}

    def __init__(self, vocab_size: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int = 1,
                 init_std: float = 0.02, proj_init_std: float = 0.01):
        super().__init__()
        _configure(self, vocab_size, d_embed, d_proj, list(cutoffs), div_val)
        self.n_clusters = len(self.cutoffs)
        self.shortlist_size = self.bounds[1]
        self.out_layers = nn.ModuleList()
        self.out_projs = nn.ParameterList()
        if div_val == 1:
            self.out_layers.append(Linear(d_embed, vocab_size))
            if d_proj != d_embed:
                for _ in range(self.n_clusters + 1):
                    self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:])):
                d_i = d_embed // div_val ** i
                self.out_layers.append(Linear(d_i, hi - lo))
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_i)))
        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.empty(self.n_clusters))
        init_weights(self, init_std, proj_init_std)

    def _log_softmax(self, hidden: torch.Tensor, i: int) -> torch.Tensor:
        """Log-softmax of cluster i's logits for ``hidden`` [n, d_proj]: head -> [n, shortlist + K],
        tail i -> [n, size_i]; float32 for half inputs."""
        lo, hi = self.bounds[i], self.bounds[i + 1]
        if self.div_val == 1:
            layer, rows = self.out_layers[0], slice(lo, hi)
            proj = self.out_projs[i] if len(self.out_projs) > 0 else None
        else:
            layer, rows, proj = self.out_layers[i], None, self.out_projs[i]
        x = hidden if proj is None else hidden @ proj  # [n, d_proj] -> [n, d_i]
        logits = layer(x, rows)
        if i == 0 and self.n_clusters > 0:  # the head's cluster columns (float, also in an int8 model)
            logits = torch.cat([logits, product(x, self.cluster_weight, self.cluster_bias).to(logits.dtype)], -1)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return F.log_softmax(logits, dim=-1)

    def _check_hidden(self, hidden: torch.Tensor) -> None:
        if hidden.dim() != 2 or hidden.shape[1] != self.d_proj:
            raise TxlError(f"hidden must have shape [N, {self.d_proj}], got {list(hidden.shape)}")

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-token negative log-likelihood.

        Args:
            hidden: ``[N, d_proj]`` float hidden states (already aligned with ``labels``; no shift).
            labels: ``[N]`` LongTensor of ids in ``[0, V)`` or ``IGNORE_INDEX`` (-100).

        Returns:
            ``[N]`` NLL in nats, in input order; exactly 0 (and no gradient) where labels == -100.

        Raises:
            TxlError: shape mismatch, or a label outside ``[0, V)`` other than -100.
        """
        self._check_hidden(hidden)
        if labels.shape != hidden.shape[:1]:
            raise TxlError(f"labels must have shape [{hidden.shape[0]}], got {list(labels.shape)}")
        valid = labels != IGNORE_INDEX
        # value checks need data (not meta), cost a host sync on a GPU and would break a compiled graph
        if reads_values(labels):
            if bool((valid & ((labels < 0) | (labels >= self.vocab_size))).any()):
                raise TxlError(f"labels must lie in [0, {self.vocab_size}) or be {IGNORE_INDEX}")
        head_lp = self._log_softmax(hidden, 0)  # [N, shortlist + K]
        # Head target: the token itself in the shortlist, else the head column of its cluster.
        head_target = labels.clamp(min=0)
        for i in range(1, self.n_clusters + 1):
            head_target = torch.where(labels >= self.bounds[i], self.shortlist_size + i - 1, head_target)
        nll = -head_lp.gather(1, head_target.unsqueeze(1)).squeeze(1)  # [N]
        compiling = torch.compiler.is_compiling()
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            if compiling:  # no data-dependent shapes: the cluster's softmax over every row, masked
                inside = (labels >= lo) & (labels < hi)
                target = (labels - lo).clamp(0, hi - lo - 1).unsqueeze(1)
                picked = self._log_softmax(hidden, i).gather(1, target).squeeze(1)
                nll = nll - torch.where(inside, picked, 0.0)
                continue
            # only this cluster's rows: a data-dependent size, one host synchronisation per cluster on an
            # accelerator, kept there because the masked form above costs a softmax over the whole tail for
            # every row (e.g. 9,000 rows x 200,000 tail tokens on WikiText-103)
            rows = ((labels >= lo) & (labels < hi)).nonzero().squeeze(1)
            tail_lp = self._log_softmax(hidden.index_select(0, rows), i)  # [n_i, size_i]
            target = (labels.index_select(0, rows) - lo).unsqueeze(1)
            nll = nll.index_add(0, rows, -tail_lp.gather(1, target).squeeze(1))
        return torch.where(valid, nll, torch.zeros_like(nll))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores ``[N, V]`` whose softmax is p(y | h): the raw logits with a single cluster (dtype of the
        computation, e.g. bf16 under autocast), the float32 log-probabilities with clusters.

        Raises:
            TxlError: ``hidden`` is not ``[N, d_proj]``.
        """
        if self.n_clusters > 0:
            return self.log_prob(hidden)
        self._check_hidden(hidden)
        proj = self.out_projs[0] if len(self.out_projs) > 0 else None
        x = hidden if proj is None else hidden @ proj
        return self.out_layers[0](x)

    def log_prob(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary log-probabilities ``[N, V]`` (nats) for ``hidden`` ``[N, d_proj]``.

        Every row is a normalised distribution over all V ids, tail clusters included. Builds
        ``[N, V]``: meant for generation and analysis, not for the training loss.

        Raises:
            TxlError: ``hidden`` is not ``[N, d_proj]``.
        """
        self._check_hidden(hidden)
        head_lp = self._log_softmax(hidden, 0)
        parts = [head_lp[:, :self.shortlist_size]]
        for i in range(1, self.n_clusters + 1):
            cluster_lp = head_lp[:, self.shortlist_size + i - 1].unsqueeze(1)  # [N, 1]
            parts.append(cluster_lp + self._log_softmax(hidden, i))  # [N, size_i]
        return torch.cat(parts, dim=1)


def tie_adaptive(emb: AdaptiveEmbedding, crit: ProjectedAdaptiveLogSoftmax, tie_weight: bool,
                 tie_projs: list[bool]) -> None:
    """Share parameters between the adaptive embedding and softmax (Transformer-XL appendix).

    ``tie_weight``: every ``crit.out_layers[i].weight`` becomes ``emb.emb_layers[i].weight`` (biases
    stay separate). ``tie_projs`` (one flag per cluster, ``len(cutoffs) + 1``, as in HF's config):
    ``crit.out_projs[i]`` becomes ``emb.emb_projs[i]`` where the flag is True (with ``div_val == 1``
    the embedding's single projection ``emb.emb_projs[0]``); when ``d_proj == d_embed`` and
    ``div_val == 1`` there are no projections and the flags are ignored.

    Raises:
        TxlError: the two modules were built with different configurations or ``tie_projs`` has the
            wrong length.
    """
    config = ("vocab_size", "d_embed", "d_proj", "cutoffs", "div_val")
    if any(getattr(emb, name) != getattr(crit, name) for name in config):
        raise TxlError("cannot tie an AdaptiveEmbedding and a ProjectedAdaptiveLogSoftmax built with "
                       "different vocab_size/d_embed/d_proj/cutoffs/div_val")
    n_clusters = len(emb.cutoffs) + 1
    if len(tie_projs) != n_clusters:
        raise TxlError(f"tie_projs needs one flag per cluster ({n_clusters}), got {len(tie_projs)}")
    if tie_weight:
        for out_layer, emb_layer in zip(crit.out_layers, emb.emb_layers):
            out_layer.weight = emb_layer.weight
    if len(crit.out_projs) == 0:
        return
    for i, tie in enumerate(tie_projs):
        if tie:
            crit.out_projs[i] = emb.emb_projs[0 if emb.div_val == 1 else i]
