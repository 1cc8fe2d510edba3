"""Evaluation with a full memory on a CPU, read in each form a commit offers: which speed work earns its code.

The model floor keeps a second form of a computation only where it is measured at least 10% faster
than the plainer one, on whole readings, not on one kernel (docs/architecture.md, "One of each").
This script reads segments of ``tgt_len`` 128 after a full memory of ``mem_len`` (random hidden
states, so every timed segment attends to ``mem_len + 128`` keys, as almost every segment of a test
split does) with a decoding state, as ``txl eval`` reads them, and times every segment but the first
(which projects the starting memory's keys). The forms alternate within every round; the median round
counts; every form must give the same loss. Forms, where the commit has them:

- ``default``: what the commit runs;
- ``whole``: the attention over every batch row and head in one call instead of blocks of bounded
  memory (``txl.kernels.cpu.in_blocks``);
- ``masked copy``: the bias as a masked copy of the realigned scores where the commit hands the kernel
  a strided view of them (``txl.kernels.cpu.masked_shift_view``);
- ``no spare room``: a decoding state without spare positions after its slots (the memory
  concatenated with each segment);
- ``no state``: no decoding state (the memory's keys and values projected again every segment; rows
  with ``mem_len`` up to 1,600).

``--rev`` runs the script inside a temporary git worktree of that commit, on the code there:

    OMP_NUM_THREADS=2 python benchmarks/eval_forms.py --rev HEAD --json benchmarks/results/eval-forms.json

Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = (  # (model widening, mem_len, batch, same_length, timed segments)
    ({}, 128, 16, False, 24),
    ({}, 640, 8, False, 16),
    ({}, 640, 8, True, 16),
    ({"d_model": 512, "d_head": 64, "d_inner": 2048}, 1600, 2, True, 16),
    # 4 of the 24 layers of the paper's enwik8 large model, at its evaluation's attention length
    ({"n_layer": 4, "d_model": 1024, "d_head": 128, "d_inner": 3072}, 3800, 4, True, 6),
)
NO_STATE_UP_TO = 1600  # mem_len of the longest row read without a state (longer ones take minutes a round)


def forms(mem_len: int) -> dict:
    """name -> a function that installs the form (by replacing module attributes) and returns its undo."""
    from txl.kernels import cpu
    from txl.model import DecodingState
    try:
        from txl import segments as reading
    except ImportError:  # older commits keep the segment loop in txl.model
        from txl.model import segments as reading

    def patch(module, name, value):
        old = getattr(module, name)
        setattr(module, name, value)
        return lambda: setattr(module, name, old)

    def whole(attend, shape, like, per_head):
        return attend(slice(None), slice(None))

    table = {"default": lambda: (lambda: None), "whole": lambda: patch(cpu, "in_blocks", whole)}
    seam = getattr(cpu, "biased_attention", None)
    if hasattr(cpu, "masked_shift_view") and seam is not None:
        table["masked copy"] = lambda: patch(cpu, "biased_attention", lambda *a, window=None, **k: seam(*a, **k,
                                                                                                       window=None))
    if "spare_room" in DecodingState.__init__.__code__.co_varnames:
        table["no spare room"] = lambda: patch(reading, "decoding_state", lambda model, span, max_tokens=None: (
            DecodingState(model.config.n_layer, span, keep_mems=False, max_tokens=max_tokens, spare_room=False)))
    if mem_len <= NO_STATE_UP_TO:
        table["no state"] = lambda: patch(reading, "decoding_state", lambda *a, **k: None)
    return table


def read(model, span, mems, inputs, labels) -> tuple[float, float]:
    """Seconds of every segment but the first, and their summed loss (nats), read with a decoding state
    after the full memory ``mems``."""
    try:
        from txl import segments as reading
    except ImportError:  # older commits keep the segment loop in txl.model
        from txl.model import segments as reading

    state = reading.decoding_state(model, span, max_tokens=span.mem_len + inputs.size(1))
    seconds, loss = 0.0, 0.0
    parts = iter(reading.segments(model, inputs, labels, span=span, mems=mems, caches=state))
    for k in range(-(-inputs.size(1) // span.tgt_len)):
        start = time.perf_counter()
        seg = next(parts)
        if k:
            seconds += time.perf_counter() - start
            loss += float(seg.output.token_loss.double().sum())
    return seconds, loss


def measure(rounds: int, which: list[int]) -> list[dict]:
    import torch

    from txl.model import AttentionSpan, TransformerXLConfig, TransformerXLLM
    from txl_studies.speed.bench import BENCH_SMALL

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    rows = []
    for wider, mem_len, batch, same_length, timed in (ROWS[i] for i in which):
        torch.manual_seed(0)
        config = TransformerXLConfig(**dict(BENCH_SMALL, **wider, dropout=0.0))
        model = TransformerXLLM(config).eval()
        span = AttentionSpan(tgt_len=128, mem_len=mem_len, same_length=same_length)
        width = 128 * (timed + 1)
        inputs = torch.randint(0, config.vocab_size, (batch, width + 1), generator=torch.Generator().manual_seed(1))
        inputs, labels = inputs[:, :-1], inputs[:, 1:]
        mems = [torch.randn(batch, mem_len, config.d_model, generator=torch.Generator().manual_seed(2 + i))
                for i in range(config.n_layer)]
        table = forms(mem_len)
        times: dict[str, list[float]] = {name: [] for name in table}
        losses: dict[str, float] = {}
        for r in range(rounds):
            for name in table if r % 2 == 0 else reversed(table):
                undo = table[name]()
                try:
                    seconds, losses[name] = read(model, span, mems, inputs, labels)
                finally:
                    undo()
                times[name].append(seconds)
        median = {name: statistics.median(t) for name, t in times.items()}
        tokens = batch * 128 * timed
        row = {"n_layer": config.n_layer, "d_model": config.d_model, "tgt_len": 128, "mem_len": mem_len,
               "batch": batch, "same_length": same_length, "timed_tokens": tokens,
               "tokens_per_s": {name: tokens / s for name, s in median.items()},
               "time_over_default": {name: s / median["default"] for name, s in median.items() if name != "default"},
               "runs_s": times, "loss_nats": losses,
               "max_loss_difference": max(losses.values()) - min(losses.values())}
        rows.append(row)
        print(f"{config.n_layer} x d_model {config.d_model}, mem_len {mem_len}, batch {batch}: " +
              ", ".join(f"{name} {v:.3f}" for name, v in row["time_over_default"].items()), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="measure the code of this commit (a temporary git worktree)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, alternating the forms' order (default 3)")
    ap.add_argument("--rows", default=",".join(map(str, range(len(ROWS)))),
                    help=f"which rows, numbered from 0 (default: all {len(ROWS)})")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    which = [int(i) for i in args.rows.split(",") if i.strip().isdigit()]
    if not which or any(not 0 <= i < len(ROWS) for i in which) or args.rounds < 1:
        raise SystemExit(f"eval_forms.py: --rows takes numbers 0 ... {len(ROWS) - 1}; --rounds >= 1")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from compare_commits import forms_record, run_at_commit

    if args.rev:
        out = ["--json", str(Path(args.json).resolve())] if args.json else []
        argv = ["--rounds", str(args.rounds), "--rows", args.rows] + out
        return run_at_commit(args.rev, __file__, argv, "python " + shlex.join(sys.argv))
    start = time.time()
    rows = measure(args.rounds, which)
    if args.json:
        Path(args.json).write_text(json.dumps(forms_record(args.rounds, rows, start), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
