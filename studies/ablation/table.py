"""The paper's ablation of recurrence and positional encoding (Dai et al. 2019, §4.3, Table 6) at small scale,
with rotary positions (Su et al. 2021) beside them.

Five variants are trained from one base :class:`~txl.config.RunConfig` at (nearly) equal parameter
count and on the same tokens, then each is scored on the same targets at several attention lengths L:

1. ``txl``: recurrence + relative encoding (``attn_type="rel"``, the base ``mem_len``); evaluated
   with ``mem_len=L`` and ``same_length``, so the query for target t sees its last min(L, t) tokens.
2. ``rel-no-recurrence``: relative encoding, ``mem_len=0`` in training and evaluation; evaluated in
   separate segments of ``tgt_len=L`` (the context fragmentation of §3.1: the query for target t
   sees 1 .. L tokens, ((t-1) mod L) + 1 of them).
3. ``shaw``: recurrence + Shaw et al. (2018) learned relative positions (``attn_type="shaw"``, the
   base ``mem_len``, clipped at ``tgt_len + mem_len - 1``, all distances seen in training); evaluated
   like ``txl``.
4. ``abs``: vanilla Transformer, absolute sinusoidal encoding, no memory; evaluated with the
   sliding window of §3.1 (``context=L``, one prediction per window), so the query for target t sees
   min(L, t) tokens, as for the memory models.
5. ``rope``: recurrence + rotary positions (Su et al. 2021, ``attn_type="rope"``: queries and keys
   rotated by their positions, no position parameters); evaluated like ``txl``. Not in the paper: the
   modern scheme most models use, here with the memory.

6. ``compressive`` (opt-in, ``compressive=True`` / ``txl ablate --compressive``): the Compressive
   Transformer (Rae et al. 2019) at the same attention span: memory of ``mem_len // 2``, compressed
   memory of the other half (``cmem_len``), rate ``model.cmem_ratio`` of the base (3 by default),
   conv1d compression; evaluated at L with ``mem_len = L // 2``, ``cmem_len = L - L // 2`` and
   ``same_length``: each query sees L key slots (up to L // 2 + c (L - L // 2) tokens back).

Parameter counts are matched by giving each variant its own ``d_inner`` (the variants differ only
in their position parameters: ``r_net`` and u/v for "rel", the ``r_emb`` tables for "shaw", nothing
for "abs" and "rope"); the remaining difference is at most half a feed-forward unit, ``n_layer * (2 * d_model + 1)
/ 2`` parameters. All variants use the base segment length and batch size, so with a token budget
they take the same number of steps over exactly the same training tokens; with a wall-clock budget
each gets an equal share of the time (steps from a timing of a few steps) and the tokens differ.
Results are reported in bits per character for byte/char corpora (perplexity for word/BPE ones).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from txl.config import RunConfig
from txl.analysis.plots import pyplot, save_figure, unit_suffix
from txl.errors import TxlError
from txl.fileio import atomic_write, claim_folder, write_json
from txl.model import TransformerXLConfig

TABLE_NAME, JSON_NAME, PLOT_NAME = "ablation.md", "results.json", "ablation.png"

# Table 6 of the paper (WikiText-103, 128M-parameter models, test perplexity at the best attention length)
PAPER_TABLE6_PPL = {"txl": 26.77, "rel-no-recurrence": 29.02, "shaw": 27.94, "abs": 31.16}


@dataclass(frozen=True)
class Variant:
    """One row of the ablation.

    Attributes:
        name: short id (run folder name). label: what it is, for tables.
        attn_type: the model's ``attn_type``. memory: trained and evaluated with the base ``mem_len``
            (True) or with none. protocol: "memory", "segments" or "sliding-window" (see the module doc).
    """

    name: str
    label: str
    attn_type: str
    memory: bool
    protocol: str


VARIANTS: tuple[Variant, ...] = (
    Variant("txl", "full Transformer-XL: recurrence + relative encoding", "rel", True, "memory"),
    Variant("rel-no-recurrence", "relative encoding, no recurrence", "rel", False, "segments"),
    Variant("shaw", "recurrence + Shaw et al. (2018) encoding", "shaw", True, "memory"),
    Variant("abs", "vanilla Transformer, absolute encoding", "abs", False, "sliding-window"),
    Variant("rope", "recurrence + rotary positions (Su et al. 2021)", "rope", True, "memory"),
)
COMPRESSIVE = Variant("compressive", "compressive memory (Rae et al. 2019), equal attention span", "rel", True,
                      "compressive")


def default_base() -> RunConfig:
    """The built-in base: a 4-layer, d_model 128 character model (about 0.87M parameters on tiny
    Shakespeare), segments of 64 with a memory of 64, batch 16, no dropout, 400 steps."""
    return RunConfig.from_dict({
        "model": {"n_layer": 4, "d_model": 128, "n_head": 4, "d_head": 32, "d_inner": 512, "dropout": 0.0,
                  "dropatt": 0.0, "tgt_len": 64, "mem_len": 64},
        "data": {"tokenizer": "char"},
        "train": {"batch_size": 16, "max_steps": 400, "lr": 2e-3, "min_lr": 2e-4, "warmup_steps": 40,
                  "log_interval": 50, "sample_tokens": 0},
    })


def count_parameters(config: TransformerXLConfig) -> int:
    """Number of parameters (tied ones once) of a model with this config (built on the CPU: the
    ablation's models are small, and the meta device would import torch's compiler stack)."""
    from txl.model import TransformerXLLM

    return sum(p.numel() for p in TransformerXLLM(config).parameters())


def variant_model_config(base: TransformerXLConfig, variant: Variant) -> TransformerXLConfig:
    """The base model config changed into ``variant`` (before parameter matching).

    Raises:
        TxlError: a base without memory (``mem_len`` 0) or not of type "rel".
    """
    if base.mem_len < 1:
        raise TxlError("the ablation base config needs model.mem_len >= 1 (the memory of the recurrent variants)")
    if base.attn_type != "rel":
        raise TxlError(f"the ablation base config must have model.attn_type='rel', got {base.attn_type!r}")
    values = base.to_dict()
    values["attn_type"] = variant.attn_type
    if not variant.memory:
        values["mem_len"] = 0
    values["cmem_len"] = 0
    if variant.protocol == "compressive":  # half the span as memory, half as compressed slots
        values["mem_len"] = base.mem_len // 2
        values["cmem_len"] = base.mem_len - base.mem_len // 2
    if variant.attn_type == "rope":
        values["clamp_len"] = 0  # (rotations have no clamp)
    if variant.attn_type == "shaw" and values["shaw_max_dist"] < 1:
        values["shaw_max_dist"] = base.tgt_len + base.mem_len - 1  # every distance seen in training
    return TransformerXLConfig.from_dict(values)


def match_parameters(config: TransformerXLConfig, target: int) -> tuple[TransformerXLConfig, int]:
    """Change ``d_inner`` so the parameter count is as close to ``target`` as it can be.

    One unit of ``d_inner`` is ``n_layer * (2 * d_model + 1)`` parameters (two weights and a bias), so
    the result differs from ``target`` by at most half of that.

    Returns:
        (the new config, its parameter count).

    Raises:
        TxlError: the target needs ``d_inner`` < 1.
    """
    unit = config.n_layer * (2 * config.d_model + 1)
    count = count_parameters(config)
    d_inner = config.d_inner + round((target - count) / unit)
    if d_inner < 1:
        raise TxlError(f"cannot match {target} parameters with attn_type={config.attn_type!r}: d_inner would be "
                       f"{d_inner}; use a larger model.d_inner")
    matched = dataclasses.replace(config, d_inner=d_inner)
    return matched, count_parameters(matched)


def plan_variants(base: RunConfig, vocab_size: int, variants: tuple[Variant, ...] = VARIANTS):
    """Model configs of all variants, parameter-matched to the full Transformer-XL.

    Returns:
        list of (variant, model config, parameter count), in ``variants`` order.
    """
    model = dataclasses.replace(base.model, vocab_size=vocab_size)
    target = count_parameters(variant_model_config(model, VARIANTS[0]))
    planned = []
    for variant in variants:
        cfg, count = match_parameters(variant_model_config(model, variant), target)
        planned.append((variant, cfg, count))
    return planned


def seconds_per_step(config: TransformerXLConfig, batch_size: int, device: str = "cpu", steps: int = 3) -> float:
    """Measured wall-clock seconds of one training step (forward, backward, AdamW; memory carried)
    on random tokens [batch_size, tgt_len], after one untimed step."""
    import torch

    from txl.model import TransformerXLLM
    from txl.runtime import resolve_device

    dev = resolve_device(device)
    model = TransformerXLLM(config).to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, config.vocab_size, (batch_size, config.tgt_len), device=dev)
    mems, start = None, 0.0
    for i in range(steps + 1):
        if i == 1:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            start = time.perf_counter()
        out = model(x, mems=mems, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mems = out.mems
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return (time.perf_counter() - start) / steps


def evaluate_variant(model, tokens, variant: Variant, length: int, unit: str, tgt_len: int, max_tokens: int):
    """Score ``tokens`` with ``variant``'s protocol at attention length ``length`` (see the module doc).

    Every protocol scores the same targets ``tokens[1 .. max_tokens]`` (one stream, no warm-up).

    Returns:
        :class:`~txl.evaluation.stream.EvalResult` (loss in nats per token).
    """
    from txl.evaluation.stream import evaluate, evaluate_sliding_window

    if variant.protocol == "memory":
        return evaluate(model, tokens, unit=unit, batch_size=1, tgt_len=tgt_len, mem_len=length, same_length=True,
                        max_tokens=max_tokens)
    if variant.protocol == "compressive":
        return evaluate(model, tokens, unit=unit, batch_size=1, tgt_len=tgt_len, mem_len=length // 2,
                        cmem_len=length - length // 2, same_length=True, max_tokens=max_tokens)
    if variant.protocol == "segments":
        return evaluate(model, tokens, unit=unit, batch_size=1, tgt_len=length, mem_len=0, max_tokens=max_tokens)
    return evaluate_sliding_window(model, tokens, context=length, stride=1, unit=unit, max_tokens=max_tokens)


PROTOCOL_TEXT = {
    "memory": "tgt_len {T}, mem_len L, same_length: sees min(L, t) tokens",
    "segments": "segments of L, no memory: sees ((t-1) mod L)+1 tokens",
    "sliding-window": "sliding window of L, stride 1: sees min(L, t) tokens",
    "compressive": "tgt_len {T}, mem_len L/2, cmem_len L/2, same_length: L key slots",
}


def run_ablation(base: RunConfig, data: str | None, out_dir: str | Path, *, budget_tokens: int | None = None,
                 budget_minutes: float | None = None, lengths: list[int] = (64, 128, 256), eval_tokens: int = 4000,
                 progress: bool = False, log: Callable[[str], None] = print, compressive: bool = False) -> dict:
    """Train and evaluate the variants (Table 6 and rotary) and write the table, JSON and plot into ``out_dir``.

    Args:
        base: the base run (model, data tokenizer, training hyper-parameters); its ``train.max_steps``
            is the budget when neither budget is given.
        data: corpus file or folder (``data.path``); None: the built-in default corpus.
        out_dir: new or empty folder; each variant trains into ``out_dir/<name>/``.
        budget_tokens: training target tokens per variant (steps = round(budget / (batch_size * tgt_len))).
        budget_minutes: total training wall-clock minutes, split equally between the variants.
        lengths: attention lengths L (tokens) for evaluation.
        eval_tokens: targets scored at each length (the first ones of the ``eval.split`` split).
        compressive: add the compressive-memory variant (see the module docstring).

    Returns:
        the results dict that is also written to ``results.json``.

    Raises:
        TxlError: both budgets, non-positive values, a base with a segment-length schedule or variable
            lengths, an ``out_dir`` that is not new or empty (or is in use by another process, or lies
            inside a checkpoint or run folder), bad data (from training).
    """
    if budget_tokens is not None and budget_minutes is not None:
        raise TxlError("give either --budget-tokens or --budget-minutes, not both")
    if (budget_tokens is not None and budget_tokens < 1) or (budget_minutes is not None and not budget_minutes > 0):
        raise TxlError("the budget must be positive")
    lengths = sorted(set(lengths))
    if not lengths or lengths[0] < 1:
        raise TxlError("the attention lengths must be positive integers")
    if eval_tokens < 1:
        raise TxlError(f"--eval-tokens must be >= 1, got {eval_tokens}")
    if base.train.tgt_len_schedule or base.train.varlen:
        raise TxlError("txl ablate trains every variant at model.tgt_len; remove train.tgt_len_schedule and "
                       "train.varlen from the base config")
    out_dir = Path(out_dir)
    # one process per folder, claimed (new or empty) before anything is read; each variant's run inside
    # it is claimed again by train()
    with claim_folder(out_dir, empty=True, inputs=[data]):
        return _run_claimed(base, data, out_dir, budget_tokens=budget_tokens, budget_minutes=budget_minutes,
                            lengths=lengths, eval_tokens=eval_tokens, progress=progress, log=log,
                            compressive=compressive)


def _run_claimed(base: RunConfig, data: str | None, out_dir: Path, *, budget_tokens: int | None,
                 budget_minutes: float | None, lengths: list[int], eval_tokens: int, progress: bool,
                 log: Callable[[str], None], compressive: bool = False) -> dict:
    """:func:`run_ablation` once the arguments are checked and ``out_dir`` is claimed."""
    from txl.training.checkpoint import load_checkpoint
    from txl.data.corpus import load_run_corpus
    from txl.training.loop import train
    from txl.evaluation.stream import metric_unit

    base = dataclasses.replace(base, data=dataclasses.replace(base.data, path=None if data is None else str(data)))
    base.check()
    corpus = load_run_corpus(base.data)
    unit = metric_unit(corpus.tokenizer.kind)
    eval_split = corpus.valid if base.eval.split == "valid" else corpus.test
    if len(eval_split) < 2:
        raise TxlError(f"the {base.eval.split} split is empty: nothing to evaluate on")
    planned = plan_variants(base, corpus.vocab_size, VARIANTS + ((COMPRESSIVE,) if compressive else ()))
    tokens_per_step = base.train.batch_size * base.model.tgt_len
    if budget_minutes is not None:
        share = budget_minutes * 60.0 / len(planned)
        timing = {v.name: seconds_per_step(cfg, base.train.batch_size, base.train.device) for v, cfg, _ in planned}
        steps = {name: max(1, int(share / s)) for name, s in timing.items()}
        log("measured s/step: " + ", ".join(f"{k} {v:.3f}" for k, v in timing.items()))
    else:
        if budget_tokens is not None and budget_tokens < tokens_per_step:
            raise TxlError(f"--budget-tokens {budget_tokens} is less than one training step "
                           f"({tokens_per_step} tokens: batch_size x tgt_len); give at least that")
        n = base.train.max_steps if budget_tokens is None else max(1, round(budget_tokens / tokens_per_step))
        steps = {v.name: n for v, _, _ in planned}
    target_params = planned[0][2]

    rows = []
    for variant, cfg, params in planned:
        n_steps = steps[variant.name]
        run = dataclasses.replace(
            base, model=cfg,
            train=dataclasses.replace(base.train, out_dir=str(out_dir / variant.name), max_steps=n_steps,
                                      eval_interval=n_steps, warmup_steps=min(base.train.warmup_steps, n_steps // 5),
                                      sample_tokens=0),
            eval=dataclasses.replace(base.eval, mem_len=cfg.mem_len, cmem_len=cfg.cmem_len, max_tokens=min(eval_tokens, 2048), warmup=False))
        log(f"{variant.name}: {params} parameters (d_inner {cfg.d_inner}), {n_steps} steps")
        result = train(run, progress=progress, log=log)
        model = load_checkpoint(result.best_dir).model
        evals = []
        for length in lengths:
            start = time.perf_counter()
            res = evaluate_variant(model, eval_split, variant, length, unit, cfg.tgt_len, eval_tokens)
            evals.append({"length": length, "value": res.value, "loss": res.loss, "n_tokens": res.n_tokens,
                          "settings": res.settings, "wall_s": round(time.perf_counter() - start, 2)})
            log(f"{variant.name} at L={length}: {unit} {res.value:.4f}")
        best = min(evals, key=lambda e: e["loss"])
        rows.append({
            "name": variant.name, "label": variant.label, "attn_type": cfg.attn_type, "recurrence": variant.memory,
            "train_mem_len": cfg.mem_len, "shaw_max_dist": cfg.shaw_max_dist if cfg.attn_type == "shaw" else None,
            "d_inner": cfg.d_inner, "params": params, "params_diff": params - target_params,
            "steps": result.steps, "tokens": result.tokens, "train_wall_s": round(result.wall_s, 1),
            "tokens_per_s": round(result.tokens_per_s, 1), "protocol": variant.protocol,
            "protocol_text": PROTOCOL_TEXT[variant.protocol].format(T=cfg.tgt_len), "results": evals,
            "best": {"length": best["length"], "value": best["value"]},
            "train_cmem_len": cfg.cmem_len, "paper_table6_ppl": PAPER_TABLE6_PPL.get(variant.name)})

    results = {
        "data": str(Path(data).resolve()) if data is not None else "built-in default corpus", "unit": unit,
        "tokenizer": corpus.tokenizer.kind, "eval_split": base.eval.split,
        "eval_tokens": rows[0]["results"][0]["n_tokens"], "lengths": lengths,
        "budget": {"tokens": budget_tokens, "minutes": budget_minutes, "default_steps": base.train.max_steps
                   if budget_tokens is None and budget_minutes is None else None},
        "tokens_per_step": tokens_per_step,
        "param_tolerance": planned[0][1].n_layer * (2 * planned[0][1].d_model + 1) // 2,
        "base": dataclasses.replace(base, model=dataclasses.replace(base.model, vocab_size=corpus.vocab_size)).to_dict(),
        "variants": rows,
    }
    write_json(out_dir / JSON_NAME, results)
    table = format_table(results)
    atomic_write(out_dir / TABLE_NAME, lambda tmp: Path(tmp).write_text(table, encoding="utf-8"))
    plot_ablation(results, out_dir / PLOT_NAME)
    return results


def format_table(results: dict) -> str:
    """The results as a Markdown table (one row per variant, one column per attention length)."""
    unit, lengths = results["unit"], results["lengths"]
    head = (["variant", "params", "tokens seen", "train wall s", "evaluation (target t)"]
            + [f"{unit} L={length}" for length in lengths] + [f"best {unit} (L)", "paper Table 6 ppl"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    best_overall = min(r["best"]["value"] for r in results["variants"])
    for r in results["variants"]:
        values = [f"{e['value']:.4f}" for e in r["results"]]
        best = f"{r['best']['value']:.4f} ({r['best']['length']})"
        if r["best"]["value"] == best_overall:
            best = f"**{best}**"
        cells = [f"`{r['name']}` {r['label']}", f"{r['params']:,}", f"{r['tokens']:,}", f"{r['train_wall_s']:.0f}",
                 r["protocol_text"], *values, best, "" if r["paper_table6_ppl"] is None else f"{r['paper_table6_ppl']}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Each cell scores the same {results['eval_tokens']:,} targets of the {results['eval_split']} split; "
                 f"parameter counts agree within {results['param_tolerance']:,} (half a feed-forward unit).")
    return "\n".join(lines) + "\n"


def describe(results: dict) -> str:
    """One-paragraph summary of a finished ablation (for the command line)."""
    best = min(results["variants"], key=lambda r: r["best"]["value"])
    unit = results["unit"]
    return (f"best: {best['name']} at {unit} {best['best']['value']:.4f} (L={best['best']['length']}); "
            + ", ".join(f"{r['name']} {r['best']['value']:.4f}" for r in results["variants"])
            + f" ({unit}, best length each; {math.fsum(r['train_wall_s'] for r in results['variants']):.0f} s of training)")


def plot_ablation(results: dict, path) -> dict:
    """Plot the metric against the attention length, one line per variant (``txl ablate``'s results).

    Returns the plotted series ``{variant name: (lengths, values)}``.

    Raises:
        TxlError: matplotlib is not installed, or the path cannot be written.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    series = {}
    for r in results["variants"]:
        xs = [e["length"] for e in r["results"]]
        ys = [e["value"] for e in r["results"]]
        ax.plot(xs, ys, marker="o", label=f"{r['name']} ({r['protocol']})")
        series[r["name"]] = (xs, ys)
    ax.set_xscale("log", base=2)
    ax.set_xticks(results["lengths"], [str(v) for v in results["lengths"]])
    ax.set_xlabel("attention length L at evaluation (tokens)")
    from txl.evaluation.stream import stored_unit

    unit = stored_unit(results["unit"], results.get("tokenizer")) or results["unit"]
    ax.set_ylabel(unit + unit_suffix(unit))
    ax.set_title("Table 6 ablation at small scale")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return series
