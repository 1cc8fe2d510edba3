"""Training and evaluation in each form of the model's own computation a commit offers: which earns its code.

The model floor keeps a second form of a computation only where it is measured at least 10% faster than
the plainer one, on whole steps or readings (docs/architecture.md, "Where a change goes").
``benchmarks/eval_forms.py`` measures the forms of evaluation around the model (blocks, the decoding
state's spare room); this script the forms inside the model's forward and backward:

- ``gather rel-shift``: the position scores realigned by a gather (:func:`txl.model.attention.rel_shift_gather`,
  the form ``torch.compile`` traces, and its scatter-add backward) where txl reads them through a strided
  view (with its own backward under autograd; in evaluation the mask added to the view in place, to the
  gather's copy here), in a training step (forward, backward, AdamW) and in
  evaluation after a full memory, on bench-small (batch 16 in training, 8 in evaluation; mem_len 128, and
  640 in evaluation);
- ``masked embedding`` (where the commit has the other form): every cluster of the adaptive embedding
  embeds every token, masked (the form for accelerators and ``torch.compile``), where txl on a CPU
  embeds each cluster's rows only, in a training step of a model with a vocabulary of 32,000 (cutoffs
  2,000 and 10,000, div_val 4) on Zipf-like ids, so that most tokens fall in the first cluster (the form
  is chosen by answering ``reads_values`` False in the adaptive module, which also skips the softmax's
  check of the labels' range, one pass over them).

The forms alternate within every round; the median round counts. ``--rev`` runs the script in a
temporary git worktree of that commit, on the code there (86a7611 is the last commit with both forms of
the adaptive embedding; a later one measures the rel-shift's forms only):

    OMP_NUM_THREADS=2 python benchmarks/model_forms.py --rev 86a7611 --json benchmarks/results/model-forms-86a7611.json

Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4  # training steps (or segments after the memory) timed per form and round


def patch(module, name, value):
    old = getattr(module, name)
    setattr(module, name, value)
    return lambda: setattr(module, name, old)


def shift_forms() -> dict:
    from txl.model import attention

    def gather(x, mask):  # (commits whose rel_shift_bias takes the boolean mask)
        return attention.rel_shift_gather(x).masked_fill(mask, float("-inf"))

    def gather_added(x, additive):  # (commits whose rel_shift_bias takes the additive mask)
        return attention.rel_shift_gather(x) + additive.to(x.dtype)

    def gather_everywhere():  # evaluation there adds the mask to rel_shift's view in place: to a gather's copy here
        undo = [patch(attention, "rel_shift_bias", gather_added), patch(attention, "rel_shift", attention.rel_shift_gather)]
        return lambda: [step() for step in reversed(undo)]

    table = {"default": lambda: (lambda: None)}
    if hasattr(attention, "additive_mask"):
        table["gather rel-shift"] = gather_everywhere
    elif hasattr(attention, "rel_shift_gather"):  # (a commit without the gather has one form)
        table["gather rel-shift"] = lambda: patch(attention, "rel_shift_bias", gather)
    return table


def embedding_forms() -> dict:
    from txl.model import adaptive

    table = {"default": lambda: (lambda: None)}
    if "nonzero" in inspect.getsource(adaptive.AdaptiveEmbedding.forward):  # the per-cluster rows form is there
        table["masked embedding"] = lambda: patch(adaptive, "reads_values", lambda tensor: False)
    return table


def train_tokens(model, optimizer, data, tgt_len: int) -> int:
    mems = None
    for k in range(STEPS):
        x, y = data[:, k * tgt_len:(k + 1) * tgt_len], data[:, k * tgt_len + 1:(k + 1) * tgt_len + 1]
        out = model(x, mems=mems, labels=y)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mems = out.mems
    return STEPS * x.numel()


def eval_tokens(model, data, span) -> tuple[int, float]:
    """Tokens of the segments after the first and the seconds they took, read after a full memory (random
    states), so that every timed segment attends to ``mem_len + tgt_len`` keys."""
    import torch

    try:
        from txl import segments as reading
    except ImportError:  # older commits keep the segment loop in txl.model
        from txl.model import segments as reading
    inputs, labels = data[:, :span.tgt_len * (STEPS + 1)], data[:, 1:span.tgt_len * (STEPS + 1) + 1]
    state = reading.decoding_state(model, span, max_tokens=span.mem_len + inputs.size(1))
    c = model.config
    mems = [torch.randn(inputs.size(0), span.mem_len, c.d_model, generator=torch.Generator().manual_seed(i))
            for i in range(c.n_layer)]
    tokens, seconds = 0, 0.0
    with torch.no_grad():
        parts = iter(reading.segments(model, inputs, labels, span=span, mems=mems, caches=state))
        for k in range(STEPS + 1):
            start = time.perf_counter()
            seg = next(parts)
            if k:
                seconds += time.perf_counter() - start
                tokens += seg.inputs.numel()
    return tokens, seconds


def measure(rounds: int) -> list[dict]:
    import torch

    from txl.model import AttentionSpan, TransformerXLConfig, TransformerXLLM
    from txl_studies.speed.bench import BENCH_SMALL

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    adaptive = dict(BENCH_SMALL, n_layer=4, vocab_size=32000, cutoffs=[2000, 10000], div_val=4)
    rows = []
    for what, reading, config, forms in (("rel-shift", "training", BENCH_SMALL, shift_forms()),
                                        ("rel-shift", "evaluation", BENCH_SMALL, shift_forms()),
                                        ("rel-shift", "evaluation", dict(BENCH_SMALL, mem_len=640), shift_forms()),
                                        ("adaptive embedding", "training", adaptive, embedding_forms())):
        if len(forms) < 2:
            continue
        torch.manual_seed(0)
        config = TransformerXLConfig(**config)
        model = TransformerXLLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch, width = (16 if reading == "training" else 8), config.tgt_len * (STEPS + 1) + 1
        ranks = torch.distributions.Pareto(1.0, 1.0).sample((batch, width)).long() - 1  # Zipf-like, from 0
        data = ranks.clamp(max=config.vocab_size - 1)
        span = AttentionSpan(tgt_len=config.tgt_len, mem_len=config.mem_len)
        times: dict[str, list[float]] = {name: [] for name in forms}
        for r in range(rounds + 1):  # round 0 warms up
            for name in forms if r % 2 == 0 else reversed(forms):
                undo = forms[name]()
                try:
                    if reading == "training":
                        model.train()
                        start = time.perf_counter()
                        tokens = train_tokens(model, optimizer, data, config.tgt_len)
                        seconds = time.perf_counter() - start
                    else:
                        model.eval()
                        tokens, seconds = eval_tokens(model, data, span)
                finally:
                    undo()
                if r:
                    times[name].append(tokens / seconds)
        median = {name: statistics.median(t) for name, t in times.items()}
        row = {"form_of": what, "reading": reading, "n_layer": config.n_layer, "d_model": config.d_model,
               "vocab_size": config.vocab_size, "batch": batch, "tgt_len": config.tgt_len, "mem_len": config.mem_len,
               "tokens_per_s": median,
               "time_over_default": {name: median["default"] / v for name, v in median.items() if name != "default"},
               "runs_tokens_per_s": times}
        rows.append(row)
        print(f"{what}, {reading}: " + ", ".join(f"{name} {v:.3f}" for name, v in row["time_over_default"].items()),
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="measure the code of this commit (a temporary git worktree)")
    ap.add_argument("--rounds", type=int, default=9, help="rounds, alternating the forms' order (default 9)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("model_forms.py: --rounds must be >= 1")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from compare_commits import forms_record, run_at_commit

    if args.rev:
        out = ["--json", str(Path(args.json).resolve())] if args.json else []
        return run_at_commit(args.rev, __file__, ["--rounds", str(args.rounds)] + out, "python " + shlex.join(sys.argv))
    start = time.time()
    rows = measure(args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps(forms_record(args.rounds, rows, start), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
