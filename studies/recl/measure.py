"""Relative effective context length (RECL; Dai et al. 2019, §4.3 and appendix C).

RECL is defined on a *group* of models ``m_1 .. m_N`` scored on the same positions ``t`` of a text.

* ``l_i(c, t) = -log P_i(x_t | x_{t-1}, ..., x_{t-c})``: loss (nats) of model i on token t given
  exactly ``c`` tokens of context.
* Baseline ``b(c, t) = min_i l_i(c, t)``: the best short-context loss of the group at each position.
* ``T`` = the top-r positions with the largest ``b(c, t)`` (``ceil(r * |positions|)`` of them;
  r = 1 keeps all): the positions where context c is least sufficient.
* Relative loss ``f_i(c, c') = 1/|T| * sum_{t in T} min(b(c, t), l_i(c', t))``: only improvements
  over the shared baseline count. Note ``f_i(c, c) = mean_T b(c, t)``, the same for every model.
* Relative gain ``g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)``: the relative
  perplexity reduction from lengthening the context from c to c'.
* RECL of model i: start at ``c = c0`` with ``c' = c + delta``; while ``g_i(c, c') >= threshold``
  (0.01 in the paper) move on to ``c = c'``; the first c whose gain falls below the threshold is
  the RECL. If the gain never drops below the threshold up to the longest context measured, the
  RECL is at least that longest context and is reported as such (``censored``).

The baseline and T are recomputed at every short length c. Pure functions on numpy arrays come
first; :func:`context_losses` measures the losses of txl models with an exact-context protocol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from txl.analysis.plots import pyplot, save_figure
from txl.data.mapped import CHUNK_TOKENS, PageBudget
from txl.errors import TxlError, counted
from txl.kernels.cpu import check_reading_fits

THRESHOLD = 0.01
RATIOS = (0.1, 0.5, 1.0)


def baseline(losses_c: np.ndarray) -> np.ndarray:
    """``b(c, t) = min_i l_i(c, t)`` (appendix C).

    Args:
        losses_c: float [N_models, P] losses (nats) of each model at context length c on P positions.

    Returns:
        float [P]: the per-position minimum over models.

    Raises:
        TxlError: not a 2-D array with at least one model and one position, or non-finite values.
    """
    losses_c = np.asarray(losses_c, dtype=np.float64)
    if losses_c.ndim != 2 or 0 in losses_c.shape:
        raise TxlError(f"losses must be [models, positions] with both > 0, got shape {losses_c.shape}")
    if not np.isfinite(losses_c).all():
        raise TxlError("losses contain NaN or infinity")
    return losses_c.min(axis=0)


def top_positions(base: np.ndarray, r: float) -> np.ndarray:
    """Indices of the top-r positions with the largest baseline loss (the set T of appendix C).

    Args:
        base: float [P] baseline losses b(c, t).
        r: ratio in (0, 1]; ``ceil(r * P)`` positions are kept (at least one).

    Returns:
        int64 [ceil(r * P)] sorted position indices. Ties at the cut are broken towards earlier
        positions, so the result is deterministic.

    Raises:
        TxlError: r outside (0, 1].
    """
    if not 0.0 < r <= 1.0:
        raise TxlError(f"r must be in (0, 1], got {r}")
    base = np.asarray(base, dtype=np.float64)
    k = max(1, math.ceil(r * base.size - 1e-9))
    order = np.argsort(-base, kind="stable")  # largest first, earlier index first among equals
    return np.sort(order[:k])


def relative_loss(base: np.ndarray, losses_long: np.ndarray, positions: np.ndarray) -> float:
    """``f_i(c, c') = mean_{t in T} min(b(c, t), l_i(c', t))`` in nats (appendix C).

    Args:
        base: float [P] baseline b(c, t); losses_long: float [P] model i's losses at c'.
        positions: int [|T|] indices of T.
    """
    base = np.asarray(base, dtype=np.float64)[positions]
    long = np.asarray(losses_long, dtype=np.float64)[positions]
    return float(np.minimum(base, long).mean())


def relative_gain(losses_c: np.ndarray, losses_long: np.ndarray, r: float) -> np.ndarray:
    """``g_i(c, c')`` for every model of the group (appendix C).

    Args:
        losses_c: float [N_models, P] losses at the short context c.
        losses_long: float [N_models, P] losses at the long context c'.
        r: top-r ratio choosing T from the baseline at c.

    Returns:
        float [N_models]: relative perplexity reductions ``(exp f(c,c) - exp f(c,c')) / exp f(c,c)``,
        in [0, 1) since losses are clipped at the baseline.

    Raises:
        TxlError: arrays of different shapes or a bad r (see :func:`baseline`, :func:`top_positions`).
    """
    losses_c = np.asarray(losses_c, dtype=np.float64)
    losses_long = np.asarray(losses_long, dtype=np.float64)
    if losses_c.shape != losses_long.shape:
        raise TxlError(f"short and long context losses differ in shape: {losses_c.shape} vs {losses_long.shape}")
    base = baseline(losses_c)
    baseline(losses_long)  # same validation for the long losses
    positions = top_positions(base, r)
    f_cc = float(base[positions].mean())
    gains = []
    for long in losses_long:
        f_long = relative_loss(base, long, positions)
        gains.append((math.exp(f_cc) - math.exp(f_long)) / math.exp(f_cc))
    return np.asarray(gains)


def gain_curve(losses: np.ndarray, r: float) -> np.ndarray:
    """Relative gains of each model for every step ``c_k -> c_{k+1}`` of a context grid.

    Args:
        losses: float [N_models, N_contexts, P]: ``losses[i, k, t] = l_i(c_k, t)`` for increasing c_k.
        r: top-r ratio.

    Returns:
        float [N_models, N_contexts - 1]: ``g_i(c_k, c_{k+1})``.

    Raises:
        TxlError: fewer than two context lengths or a malformed array.
    """
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 3 or losses.shape[1] < 2:
        raise TxlError(f"losses must be [models, contexts >= 2, positions], got shape {losses.shape}")
    return np.stack([relative_gain(losses[:, k], losses[:, k + 1], r) for k in range(losses.shape[1] - 1)], axis=1)


def recl_from_gains(contexts: list[int], gains: np.ndarray, threshold: float = THRESHOLD) -> tuple[int, bool]:
    """The thresholding walk of appendix C for one model.

    Args:
        contexts: increasing context lengths ``c_0 < c_1 < ...`` (equally spaced by delta in the paper).
        gains: float [len(contexts) - 1], ``gains[k] = g(c_k, c_{k+1})``.
        threshold: minimum relative gain to keep going (0.01 in the paper).

    Returns:
        (recl, censored): the first ``c_k`` with ``gains[k] < threshold`` and False; or the last
        context length and True when every measured gain reaches the threshold (RECL >= that).
        Later gains after the first failing step are never looked at (the walk stops there).
    """
    if len(gains) != len(contexts) - 1:
        raise TxlError(f"need one gain per step: {len(contexts)} contexts, {len(gains)} gains")
    for k, g in enumerate(gains):
        if g < threshold:
            return int(contexts[k]), False
    return int(contexts[-1]), True


@dataclass
class ReclResult:
    """RECL of a model group.

    Attributes:
        names: model labels [N]; contexts: context lengths c_k (tokens); ratios: the r values.
        recl: ``recl[r][name]`` RECL in tokens; censored: ``censored[r][name]`` True when RECL is
            only a lower bound (gain >= threshold up to the longest context).
        gains: ``gains[r]`` float [N, len(contexts) - 1] relative gains g_i(c_k, c_{k+1}).
        mean_loss: float [N, len(contexts)] mean loss (nats/token) of each model at each c_k.
        threshold: the gain threshold; n_positions: positions scored per model and context.
    """

    names: list[str]
    contexts: list[int]
    ratios: list[float]
    recl: dict[float, dict[str, int]]
    censored: dict[float, dict[str, bool]]
    gains: dict[float, np.ndarray]
    mean_loss: np.ndarray
    threshold: float
    n_positions: int
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready form (lists, plain floats)."""
        return {"names": self.names, "contexts": self.contexts, "ratios": self.ratios, "threshold": self.threshold,
                "n_positions": self.n_positions, "settings": self.settings,
                "recl": {str(r): self.recl[r] for r in self.ratios},
                "censored": {str(r): self.censored[r] for r in self.ratios},
                "gains": {str(r): self.gains[r].tolist() for r in self.ratios},
                "mean_loss": self.mean_loss.tolist()}

    def markdown(self) -> str:
        """A table like the paper's Table 8: one row per model, one column per r (">= c" when censored)."""
        head = "| model | " + " | ".join(f"r = {r:g}" for r in self.ratios) + " |"
        rows = [head, "|---|" + "---|" * len(self.ratios)]
        for name in self.names:
            cells = [(">= " if self.censored[r][name] else "") + str(self.recl[r][name]) for r in self.ratios]
            rows.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(rows)


def recl_table(losses: np.ndarray, names: list[str], contexts: list[int], ratios=RATIOS,
               threshold: float = THRESHOLD, settings: dict | None = None) -> ReclResult:
    """RECL of every model of a group for several r, from a loss array.

    Args:
        losses: float [N_models, N_contexts, P] with ``losses[i, k, t] = l_i(contexts[k], t)`` (nats).
        names: N model labels; contexts: increasing context lengths.
        ratios: r values (paper: 0.1, 0.5, 1.0); threshold: gain threshold (paper: 0.01).

    Raises:
        TxlError: inconsistent sizes, duplicate names, contexts not increasing.
    """
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 3 or losses.shape[0] != len(names) or losses.shape[1] != len(contexts):
        raise TxlError(f"losses shape {losses.shape} does not match {len(names)} models x {len(contexts)} contexts")
    if len(set(names)) != len(names):
        raise TxlError(f"model names must be distinct, got {names}")
    if any(b <= a for a, b in zip(contexts, contexts[1:])):
        raise TxlError(f"context lengths must increase, got {contexts}")
    recl, censored, gains = {}, {}, {}
    for r in ratios:
        gains[r] = gain_curve(losses, r)
        recl[r], censored[r] = {}, {}
        for i, name in enumerate(names):
            recl[r][name], censored[r][name] = recl_from_gains(contexts, gains[r][i], threshold)
    return ReclResult(names=list(names), contexts=[int(c) for c in contexts], ratios=[float(r) for r in ratios],
                      recl=recl, censored=censored, gains=gains, mean_loss=losses.mean(axis=2), threshold=threshold,
                      n_positions=losses.shape[2], settings=dict(settings or {}))


def context_losses(model, tokens: np.ndarray, contexts: list[int], positions: np.ndarray, *,
                   batch_size: int = 64) -> np.ndarray:
    """Measure ``l(c, t) = -log P(x_t | x_{t-c} .. x_{t-1})`` exactly, for every c and position t.

    Protocol: for each position t and length c, the model reads the window ``tokens[t-c : t]`` from
    scratch (no memory, ``mem_len=0``, no same-length or clamping changes) and its last output scores
    ``tokens[t]``. Every scored token therefore sees exactly c tokens of context, for relative
    (Transformer-XL) and absolute (vanilla) models alike; with a memory, the cached hidden states
    would carry information from beyond c. Windows are batched ``batch_size`` at a time.
    A compressive model (``cmem_len > 0``, Rae et al. 2019) reads each window from scratch in its
    training segments, with its memory and compressed memory: still exactly c tokens of context,
    but what lies beyond one segment reaches the scored token the way it does in use (read in one
    segment, its compressed memory would never be filled).

    Args:
        model: a :class:`~txl.model.TransformerXLLM` (its mode is restored afterwards; its config is not changed).
        tokens: 1-D int token array; positions: int [P] indices t with ``t >= max(contexts)``.
        contexts: context lengths c >= 1.

    Returns:
        float64 [len(contexts), P] losses in nats.

    Raises:
        TxlError: a position without enough context or outside the text, or c < 1.
    """
    import torch
    import torch.nn.functional as F

    from txl.data.mapped import token_array
    from txl.segments import eval_mode, segments

    data = token_array(tokens, min_tokens=0, vocab_size=model.config.vocab_size)  # a mapped split stays on disk
    positions = np.asarray(positions, dtype=np.int64)
    if min(contexts) < 1:
        raise TxlError(f"context lengths must be >= 1, got {contexts}")
    if positions.size == 0 or positions.min() < max(contexts) or positions.max() >= len(data):
        raise TxlError(f"scored positions must lie in [{max(contexts)}, {len(data)}) so that every context fits")
    device = next(model.parameters()).device
    out = np.empty((len(contexts), positions.size), dtype=np.float64)
    offsets = np.arange(-max(contexts), 0)
    with eval_mode(model):
        for k, c in enumerate(contexts):
            window = model.config.span.replace(tgt_len=c, mem_len=0, cmem_len=0)  # one segment per window, no memory
            if model.config.cmem_len > 0:  # compressive: the window in training segments, memory and compressed memory
                window = model.config.span
            for s in range(0, positions.size, batch_size):
                pos = positions[s:s + batch_size]
                windows = torch.from_numpy(data[pos[:, None] + offsets[-c:][None, :]].astype(np.int64)).to(device)  # [b, c]
                targets = torch.from_numpy(data[pos].astype(np.int64)).to(device)
                check_reading_fits(model, windows, window)
                for seg in segments(model, windows, span=window):
                    pass  # the last segment ends on the window's last token
                logits = seg.output.logits[:, -1]
                wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
                out[k, s:s + pos.size] = F.cross_entropy(wide, targets, reduction="none").double().cpu().numpy()
    return out


def scored_positions(n_tokens: int, max_context: int, n_positions: int) -> np.ndarray:
    """``n_positions`` evenly spaced positions in ``[max_context, n_tokens)`` (all of them if fewer).

    Raises:
        TxlError: the text is not longer than ``max_context``.
    """
    available = n_tokens - max_context
    if available < 1:
        raise TxlError(f"the text has {counted(n_tokens, 'token')}: RECL needs more than the longest context "
                       f"({max_context})")
    if n_positions <= 0 or n_positions >= available:
        return np.arange(max_context, n_tokens)
    return np.unique(np.linspace(max_context, n_tokens - 1, n_positions).round().astype(np.int64))


def equal_arrays(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two 1-D token arrays hold the same ids, compared ``CHUNK_TOKENS`` at a time."""
    if len(a) != len(b):
        return False
    budgets = PageBudget(a), PageBudget(b)
    for start in range(0, len(a), CHUNK_TOKENS):
        if not np.array_equal(a[start:start + CHUNK_TOKENS], b[start:start + CHUNK_TOKENS]):
            return False
        for budget in budgets:
            budget.read(min(CHUNK_TOKENS, len(a) - start))
    return True


def plot_recl_gains(result, path) -> dict:
    """Plot RECL's relative gain (a :class:`~txl_studies.recl.measure.ReclResult`) g(c, c + delta) against c, one panel per r, one line per model (PNG).

    The threshold is drawn as a dashed line. Returns the plotted series
    ``{r: {name: (c values, gains)}}`` so callers and tests can check the data.

    Raises:
        TxlError: matplotlib is not installed.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, len(result.ratios), figsize=(4.2 * len(result.ratios), 3.4), squeeze=False)
    series = {}
    xs = result.contexts[:-1]
    for ax, r in zip(axes[0], result.ratios):
        series[r] = {}
        for i, name in enumerate(result.names):
            ys = result.gains[r][i]
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
            series[r][name] = (list(xs), ys.tolist())
        ax.axhline(result.threshold, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"r = {r:g}")
        ax.set_xlabel("context length c (tokens)")
        ax.set_ylabel("relative gain g(c, c + Δ)")
    axes[0][0].legend(fontsize=8)
    save_figure(fig, path)
    return series
