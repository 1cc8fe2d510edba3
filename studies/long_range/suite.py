"""How far does the memory carry a fact? Retrieval accuracy against distance (``txl bench --long-range``).

Each *row* is a model trained from scratch on episodes of :mod:`txl_studies.long_range.episodes` (a fact,
filler, a question; the loss on the answer only; training filler and values) at distances drawn
half uniformly, half log-uniformly from 8 up to what it should reach, for the same number of steps of the same number of episodes,
then asked, at each distance d, for a pass-key and for one of several bindings (associative
recall), on held-out filler with held-out values (:func:`txl_studies.long_range.scoring.retrieval_score`).
Each episode is read from an empty memory, segment by segment with the memory carried, as
fine-tuning reads its pairs (:class:`txl_studies.long_range.task.ExampleTask`). The rows differ only
in how they reach back:

- Transformer-XL with ``mem_len`` 64, 256 and 1,024 (direct attention covers ``mem_len + tgt_len``
  tokens; stacked layers up to about ``n_layer × mem_len + tgt_len``);
- a compressed memory (Rae et al. 2019) with as many slots as the 256 memory: 128 plain + 128
  compressed at rate 4 (covers 128 + 512 tokens);
- the same model without memory (``mem_len`` 0: a segment of ``tgt_len`` is all it sees);
- a vanilla Transformer (``attn_type="abs"``) whose window equals the 256 row's attention length
  (trained on segments of that length, evaluated with the sliding window of §3.1);
- ``mem_len`` 64 trained with back-propagation through 4 segments (``grad_segments`` 4) on facts
  up to that far back: does training through the memory extend the usable reach?

Each row is trained on distances up to its direct reach (or, with back-propagation through K
segments, up to what those segments and the memory before them cover). Results are the mean and
the spread over seeds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from txl_studies.long_range.episodes import CLOSE, FACT, TASKS, VALUE_BYTES, episode, episode_batch, load_filler
from txl.data.tokenizers.simple import ByteTokenizer
from txl.errors import TxlError
from txl.kernels.cpu import check_reading_fits
from txl_studies.long_range.scoring import retrieval_score
from txl.segments import eval_mode, segments
from txl.fileio import atomic_write, claim_folder, write_json
from txl.model import TransformerXLConfig
from txl.config import AttentionSpan, RunConfig
from txl.training.loop import train
from txl_studies.long_range.task import ExampleTask

__all__ = ["Row", "ROWS", "EXTRA_ROWS", "DISTANCES", "Budget", "run_long_range", "format_table", "fact_attention", "reachable_share"]

DISTANCES = (16, 64, 256, 512, 1024, 2048, 4096, 8192)
TABLE_NAME, JSON_NAME, PLOT_NAME = "long_range.md", "results.json", "long_range.png"
ATTENTION_EPISODES = 16  # episodes per task and distance whose attention on the fact is measured


@dataclass(frozen=True)
class Row:
    """One model of the suite.

    Attributes:
        name: short id (run folder name). label: what it is, for tables.
        attn_type: "rel" (Transformer-XL) or "abs" (vanilla). mem_len, cmem_len, cmem_ratio: its memory.
        grad_segments: segments per training step with back-propagation between them.
        window: for "abs", the window it is trained and evaluated with (tokens).
        n_layer: its own depth (0: the budget's ``n_layer``).
    """

    name: str
    label: str
    attn_type: str = "rel"
    mem_len: int = 0
    cmem_len: int = 0
    cmem_ratio: int = 4
    grad_segments: int = 1
    window: int = 0
    n_layer: int = 0

    def layers(self, budget: "Budget") -> int:
        """Its number of layers: its own ``n_layer``, else the budget's."""
        return self.n_layer or budget.n_layer

    def reach(self, tgt_len: int) -> int:
        """Tokens back that one attention layer covers: ``mem_len + cmem_len × cmem_ratio + tgt_len``
        (the window for "abs")."""
        if self.attn_type == "abs":
            return self.window
        return self.mem_len + self.cmem_len * self.cmem_ratio + tgt_len

    def stacked_reach(self, tgt_len: int, n_layer: int) -> int:
        """What ``n_layer`` stacked layers can cover at most: each layer adds one memory length."""
        if self.attn_type == "abs" or not (self.mem_len or self.cmem_len):
            return self.reach(tgt_len)
        return n_layer * (self.mem_len + self.cmem_len * self.cmem_ratio) + tgt_len

    def train_distances(self, tgt_len: int, cap: int = 0) -> tuple[int, int]:
        """The distances its training facts are asked at: up to its direct reach, or for K > 1 segments of
        back-propagation, up to what those segments and the memory before them cover; at most ``cap``
        (0: no cap)."""
        high = self.reach(tgt_len) if self.grad_segments == 1 else self.mem_len + self.grad_segments * tgt_len
        return 8, max(min(high, cap) if cap else high, 16)


ROWS = (
    Row("mem64", "Transformer-XL, mem_len 64", mem_len=64),
    Row("mem256", "Transformer-XL, mem_len 256", mem_len=256),
    Row("mem1024", "Transformer-XL, mem_len 1,024", mem_len=1024),
    Row("cmem", "compressed memory: 128 + 128 slots at rate 4", mem_len=128, cmem_len=128, cmem_ratio=4),
    Row("mem0", "no memory (mem_len 0)", mem_len=0),
    Row("abs", "vanilla Transformer, window 320 (= mem256's attention length)", attn_type="abs", window=320),
    Row("mem64-bptt4", "mem_len 64, back-propagation through 4 segments", mem_len=64, grad_segments=4),
)

# rows outside the equal-budget set, run by name (--rows): the recipes that use the stacked reach
# (docs/long-range.md: mem64-bptt2 with 3,000 steps, mem64-L4-bptt4 with 2,000)
EXTRA_ROWS = (
    Row("mem64-bptt2", "mem_len 64, back-propagation through 2 segments", mem_len=64, grad_segments=2),
    Row("mem64-L4-bptt4", "4 layers, mem_len 64, back-propagation through 4 segments", mem_len=64, grad_segments=4,
        n_layer=4),
)


@dataclass(frozen=True)
class Budget:
    """Model size and training budget shared by every row.

    Attributes:
        steps: optimizer steps per row, each on ``batch_size`` episodes (the same number of training
            episodes, hence answers, for every row), drawn from a pool of ``pool`` distinct episodes.
        n_layer, d_model, n_head, d_inner: the model (byte level, pre-LayerNorm, no dropout).
        lr, warmup_steps: AdamW peak rate, linear warm-up (then cosine decay to lr / 10).
        clamp_len: relative distances clamped beyond this (0: none).
        episodes: episodes per distance and task in evaluation.
        max_train_distance: no training episode is longer than this distance (the cost of a step grows
            with it); a row that reaches further is asked beyond what it was trained on.
    """

    steps: int = 1000
    batch_size: int = 32
    tgt_len: int = 64
    n_layer: int = 2
    d_model: int = 128
    n_head: int = 4
    d_inner: int = 512
    lr: float = 2e-3
    warmup_steps: int = 200
    clamp_len: int = 0
    episodes: int = 64
    pool: int = 16384
    max_train_distance: int = 512


def row_run(row: Row, budget: Budget, seed: int, out_dir: Path) -> RunConfig:
    """The run config a row trains with (byte vocabulary)."""
    steps = budget.steps
    tgt_len = row.window if row.attn_type == "abs" else budget.tgt_len
    model = TransformerXLConfig(vocab_size=256, n_layer=row.layers(budget), d_model=budget.d_model, n_head=budget.n_head,
                                d_head=budget.d_model // budget.n_head, d_inner=budget.d_inner, dropout=0.0,
                                dropatt=0.0, pre_lnorm=True, attn_type=row.attn_type, tgt_len=tgt_len,
                                mem_len=row.mem_len if row.attn_type != "abs" else 0,
                                cmem_len=row.cmem_len, cmem_ratio=row.cmem_ratio if row.cmem_len else 1,
                                clamp_len=budget.clamp_len if row.attn_type != "abs" else 0)
    run = RunConfig.from_dict({
        "train": {"out_dir": str(out_dir), "batch_size": budget.batch_size, "max_steps": steps, "lr": budget.lr,
                  "min_lr": budget.lr / 10, "warmup_steps": min(budget.warmup_steps, max(1, steps // 4)),
                  "clip": 1.0, "eval_interval": steps, "log_interval": max(1, steps // 20), "seed": seed,
                  "sample_tokens": 0, "keep_last": 1},
        "data": {"tokenizer": "byte"}, "eval": {"batch_size": 32}})
    run.model = model
    return run


def examples(rng, filler: np.ndarray, n: int, distances: tuple[int, int], test: bool = False) -> list:
    """``n`` training episodes as rows ``(ids, start)`` for :class:`~txl_studies.long_range.task.ExampleTask`.

    Each is a pass-key or an associative episode (at random) at a distance drawn from ``distances``
    (half uniformly, half log-uniformly, so that short and long distances are both well represented).
    An associative episode then also asks for each of its other bindings, in random order, after the
    first answer: four answers for the reading of one episode. The scored part starts at the first
    answer (the later questions' handles are scored too: a guess among the ones not yet asked).
    """
    rows = []
    lo, hi = distances
    for _ in range(n):
        d = int(rng.integers(lo, hi + 1)) if rng.random() < 0.5 else int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))
        e = episode(rng, filler, d, TASKS[int(rng.integers(len(TASKS)))], test=test)
        more = [np.array([CLOSE, FACT, h, *v.tolist()]) for h, v in
                (e.others[i] for i in rng.permutation(len(e.others)))]
        ids = np.concatenate([e.tokens[:e.answer + VALUE_BYTES], *more]).astype(np.int64)
        rows.append((ids, e.answer))
    return rows


def evaluate_row(model, row: Row, budget: Budget, distances: list[int], filler, seed: int) -> dict:
    """Exact-match accuracy (and byte accuracy) per task and distance on the test filler, and for plain
    memory rows the attention on the fact at the question (:func:`fact_attention`, first 16 episodes)
    and the ceiling of accuracy through one layer and through all (``reachable``: :func:`reachable_share`)."""
    out: dict = {}
    span = AttentionSpan(budget.tgt_len, row.mem_len, clamp_len=budget.clamp_len, cmem_len=row.cmem_len) \
        if row.attn_type != "abs" else None
    for task in TASKS:
        out[task] = {}
        for d in distances:
            rng = np.random.default_rng([seed, d, TASKS.index(task), 7])
            episodes = [episode(rng, filler.test, d, task, tail=int(rng.integers(0, budget.tgt_len)))
                        for _ in range(budget.episodes)]
            tokens, labels = episode_batch(episodes)
            score = retrieval_score(model, tokens, labels, span=span, context=row.window or None)
            out[task][str(d)] = {"accuracy": score.accuracy, "byte_accuracy": score.byte_accuracy,
                                 "episodes": int(score.exact.size)}
            if span is not None and not row.cmem_len:
                out[task][str(d)]["fact_attention"] = fact_attention(model, episodes[:ATTENTION_EPISODES], span,
                                                                     width=tokens.shape[1])
                out[task][str(d)]["reachable"] = [reachable_share(episodes, budget.tgt_len, row.mem_len, n)
                                                  for n in (1, row.layers(budget))]  # direct, stacked
    return out


def reachable_share(episodes: list, tgt_len: int, mem_len: int, layers: int, width: int | None = None) -> float:
    """The share of ``episodes`` whose answer the model *could* read from the fact: the ceiling of accuracy.

    Read as :func:`~txl_studies.long_range.scoring.retrieval_score` reads them (left-padded to ``width``,
    segments of ``tgt_len`` from column 0, memory ``mem_len``, no ``same_length``), a layer's state
    at column p sees the previous layer's states from ``start(p) - mem_len`` on (``start(p)``: the
    first column of p's segment; paper §3.2). Through ``layers`` layers the earliest column within
    reach is that step taken ``layers`` times, from the longest-reaching state each time (the
    O(N × L) dependency length). An episode counts when both value bytes are within reach of the
    queries that predict them (each query is ``d - 1`` after its value byte).

    Args:
        episodes: :class:`~txl_studies.long_range.episodes.Episode` list; tgt_len, mem_len: the reading span;
        layers: 1 for the direct reach, ``n_layer`` for the stacked reach; width: the padded length
            (None: the longest episode's).

    Returns:
        a share in [0, 1].
    """
    width = max([len(e.tokens) for e in episodes] + [width or 0])

    def earliest(column: int) -> int:
        for _ in range(layers):
            column = column - column % tgt_len - mem_len
        return column

    ok = 0
    for e in episodes:
        first = width - len(e.tokens) + e.answer - 1  # column of the query predicting the value's first byte
        ok += all(q - (e.distance - 1) >= earliest(q) for q in (first, first + 1))
    return ok / len(episodes)


def fact_attention(model, episodes: list, span: AttentionSpan, width: int | None = None) -> list[float]:
    """Attention on the fact at the question, per layer: the evidence of what the model looks at.

    For each episode, the query that predicts the answer's first byte (the position before it) is read
    as in :func:`~txl_studies.long_range.scoring.retrieval_score` (left-padded to ``width``, segment by segment
    with the memory); for each layer, its attention mass on the key positions of the asked fact's value
    bytes is taken in the head that puts the most there. Zero when the value is outside the layer's
    keys (beyond ``mem_len`` + the query's position in its segment): information from further back can
    only arrive through memory states that attended to it one segment earlier (the stacked reach).

    Args:
        model: a :class:`~txl.model.TransformerXLLM` with plain memory (``attn_type`` "rel", no ``cmem_len``).
        episodes: :class:`~txl_studies.long_range.episodes.Episode` list; span: the span to read with.
        width: the padded length the episodes were scored at (None: the longest episode's), so that
            each sits at the same place in its segments as when its accuracy was measured.

    Returns:
        per layer, the mean over episodes of that share (a probability, 0..1), rounded to 4 places.
    """
    return [round(float(v), 4) for v in fact_shares(model, episodes, span, width).mean(0)]


@torch.no_grad()
def fact_shares(model, episodes: list, span: AttentionSpan, width: int | None = None) -> np.ndarray:
    """float64 [n_episodes, n_layer]: the per-episode shares that :func:`fact_attention` averages."""
    from txl.analysis.attention_maps import segment_probabilities

    tokens, _ = episode_batch(episodes, width=width)  # padded on the left as the scored batch was
    width = tokens.shape[1]
    device = next(model.parameters()).device
    shares = np.zeros((len(episodes), len(model.layers)))
    check_reading_fits(model, tokens, span)
    with eval_mode(model):
        for seg in segments(model, torch.as_tensor(tokens, device=device), span=span):
            # per layer [b, H, t, K]; every row is in every segment
            probs = segment_probabilities(model, seg.inputs, seg.mems, span)
            t, klen = seg.inputs.size(1), probs[0].size(-1)
            first_key = seg.start - (klen - t)  # column of key 0 (the memory holds the klen - t columns before)
            for b, e in enumerate(episodes):
                shift = width - len(e.tokens)
                query = shift + e.answer - 1
                if not seg.start <= query < seg.start + t:
                    continue
                keys = np.arange(VALUE_BYTES) + shift + e.answer - e.distance - first_key
                keys = keys[(keys >= 0) & (keys < klen)]
                for layer, p in enumerate(probs):
                    shares[b, layer] = float(p[b, :, query - seg.start, keys].sum(-1).max()) if keys.size else 0.0
    return shares


def run_long_range(out_dir: str | Path, *, rows: tuple[Row, ...] = ROWS, seeds: tuple[int, ...] = (0, 1, 2),
                   budget: Budget = Budget(), distances: tuple[int, ...] = DISTANCES,
                   progress: bool = False, log: Callable[[str], None] = print, plot: bool = True) -> dict:
    """Train every row with every seed, evaluate, and write the table, results JSON and plot into ``out_dir``.

    Args:
        out_dir: a new or empty folder; row r, seed s trains into ``out_dir/<r>/seed<s>/``.
        rows, seeds, budget: what to train (see :class:`Row`, :class:`Budget`).
        distances: the distances asked at; each row is also asked at its direct reach and twice that.
        plot: also draw ``long_range.png`` (needs matplotlib).

    Returns:
        the results dict written to ``results.json``.

    Raises:
        TxlError: an ``out_dir`` that is not new or empty, or in use; impossible settings.
    """
    if not rows or not seeds:
        raise TxlError("give at least one row and one seed")
    out_dir = Path(out_dir)
    with claim_folder(out_dir, empty=True):
        return _run(out_dir, rows, seeds, budget, distances, progress, log, plot)


def _run(out_dir, rows, seeds, budget, distances, progress, log, plot) -> dict:
    filler = load_filler(seed=0)
    tokenizer = ByteTokenizer()
    results = {"budget": dataclasses.asdict(budget), "seeds": list(seeds), "rows": [], "tasks": list(TASKS)}
    for row in rows:
        asked = sorted(set(distances) | {row.reach(budget.tgt_len), 2 * row.reach(budget.tgt_len)})
        entry = {**dataclasses.asdict(row), "reach": row.reach(budget.tgt_len),
                 "stacked_reach": row.stacked_reach(budget.tgt_len, row.layers(budget)),
                 "train_distances": list(row.train_distances(budget.tgt_len, budget.max_train_distance)),
                 "distances": asked, "seeds": []}
        results["rows"].append(entry)
        for seed in seeds:
            run = row_run(row, budget, seed, out_dir / row.name / f"seed{seed}")
            steps = run.train.max_steps
            rng = np.random.default_rng([seed, 11])
            reach = row.train_distances(budget.tgt_len, budget.max_train_distance)
            task = ExampleTask(examples(rng, filler.train, min(budget.pool, steps * budget.batch_size), reach),
                               examples(rng, filler.valid, 256, reach), tokenizer, grad_segments=row.grad_segments,
                               description=f"fact/question episodes at distances {reach[0]}-{reach[1]}")
            log(f"{row.name} seed {seed}: {row.label}; {steps} steps")
            start = time.perf_counter()
            trained = train(run, task=task, progress=progress, log=lambda m: None)
            wall = time.perf_counter() - start
            from txl.training.checkpoint import load_checkpoint

            model = load_checkpoint(trained.run_dir / "last").model
            scores = evaluate_row(model, row, budget, asked, filler, seed)
            entry["seeds"].append({"seed": seed, "train_wall_s": round(wall, 1), "steps": steps,
                                   "valid_answer_loss": trained.final.loss, "scores": scores})
            summary = ", ".join(f"{d}: {scores['pass-key'][str(d)]['accuracy']:.2f}/"
                                f"{scores['associative'][str(d)]['accuracy']:.2f}" for d in asked)
            log(f"  trained in {wall:.0f} s; accuracy pass-key/associative by distance: {summary}")
            write_json(out_dir / JSON_NAME, results)  # after every seed: a long run can be read (and cut) as it goes
    table = format_table(results)
    atomic_write(out_dir / TABLE_NAME, lambda tmp: Path(tmp).write_text(table, encoding="utf-8"))
    if plot:
        from txl_studies.long_range.plot import plot_long_range

        plot_long_range(plot_series(results), out_dir / PLOT_NAME)
    return results


def plot_series(results: dict) -> dict:
    """``{task: {row: (distances, means, lows, highs, reach)}}`` over seeds, for :func:`plot_long_range`."""
    series: dict = {}
    for task in results["tasks"]:
        series[task] = {}
        for r in results["rows"]:
            xs = [d for d in r["distances"] if not math.isnan(summarise(r, task, d)[0])]
            stats = [summarise(r, task, d) for d in xs]
            series[task][r["name"]] = (xs, [s[0] for s in stats], [s[1] for s in stats], [s[2] for s in stats],
                                       r["reach"])
    return series


def summarise(entry: dict, task: str, d: int) -> tuple[float, float, float]:
    """(mean, min, max) over seeds of a row's accuracy at distance d (NaN where not asked)."""
    values = [s["scores"][task][str(d)]["accuracy"] for s in entry["seeds"] if str(d) in s["scores"][task]]
    if not values:
        return math.nan, math.nan, math.nan
    return float(np.mean(values)), float(np.min(values)), float(np.max(values))


def format_table(results: dict) -> str:
    """A markdown table per task: each row's accuracy (mean over seeds, min-max) at each distance; then, for
    the rows where it was measured, each layer's attention on the fact (:func:`fact_attention`)."""
    distances = sorted({d for r in results["rows"] for d in r["distances"]})
    lines = []
    for task in results["tasks"]:
        lines += [f"### {task}", "", "| row | reach | " + " | ".join(str(d) for d in distances) + " |",
                  "|---|---|" + "---|" * len(distances)]
        for r in results["rows"]:
            cells = []
            for d in distances:
                mean, lo, hi = summarise(r, task, d)
                cells.append("" if math.isnan(mean) else (f"{mean:.2f}" if lo == hi else f"{mean:.2f} ({lo:.2f}-{hi:.2f})"))
            lines.append(f"| {r['name']} | {r['reach']} | " + " | ".join(cells) + " |")
        lines.append("")
        shown = [r for r in results["rows"] if any("fact_attention" in v for v in r["seeds"][0]["scores"][task].values())]
        if shown:
            lines += [f"#### {task}: attention on the fact at the question (each layer's share, mean over seeds)", "",
                      "| row | " + " | ".join(str(d) for d in distances) + " |", "|---|" + "---|" * len(distances)]
            for r in shown:
                cells = []
                for d in distances:
                    per_seed = [s["scores"][task][str(d)].get("fact_attention") for s in r["seeds"]
                                if str(d) in s["scores"][task]]
                    per_seed = [v for v in per_seed if v is not None]
                    cells.append("/".join(f"{v:.2f}" for v in np.mean(per_seed, axis=0)) if per_seed else "")
                lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)
