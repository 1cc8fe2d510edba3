"""Summaries of long documents, measured on the standard library: ROUGE of (a) / (b) / (c) on the test split.

Runs, printing each command (skipping the ones whose output already exists):

  1. ``txl data docstrings --out WORK/data --split 0.5,0.1,0.4 --short-train --package-train --package-pretrain``
     (``--data-args`` gives others, e.g. ``--split 0.7,0.1,0.2 --short-train --package-train``): functions
     and classes of the top-level standard-library modules with their docstring removed (documents), the
     first docstring sentence (summaries), split by module; ``train-with-packages.jsonl``, what the
     fine-tuning reads: the train pairs, the shorter documents of the train modules and every pair of the
     standard library's packages (none in a valid or test module); and ``WORK/data/pretrain``: the
     default corpus without the valid and test modules, and the package files;
  2. ``txl train WORK/data/pretrain --config studies/summaries/docstrings-lm.toml --out WORK/lm``: a BPE
     language model that has not seen the held-out modules (``--lm RUN`` uses an existing one);
  3. for each seed: ``txl finetune --init WORK/lm --config studies/summaries/summarize-docstrings.toml --out
     WORK/ft-seedS``, then ``txl summarize`` on the test pairs: (b) reading only the last ``tgt_len``
     tokens of each document (``--prompt-tokens``), (c) reading the whole document with the memory, both
     greedy with ``--no-repeat-ngram-size 3 --repetition-penalty 1.2`` (``--summarize-args``);

then writes (``--json``) and prints ROUGE-1/2/L F1 (rouge-score, stemmed) of (a) the words of the
function or class name, (b) and (c) for every seed, with 95% bootstrap intervals over the test
documents (:func:`txl.evaluation.intervals.bootstrap_interval`), the paired intervals of (c) - (a)
and (c) - (b), the fraction of summaries that end (the model wrote its end marker), the number of
distinct summaries, and examples. Usage::

    OMP_NUM_THREADS=2 python -m txl_studies.summaries.run --work runs/docstrings-split4 \\
        --json benchmarks/results/summaries-docstrings-split4.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path



def txl(*argv: str) -> float:
    """Run ``txl ARGV`` (this checkout's), echoing the command; returns its wall time in seconds.

    A step that fails (txl has printed why) ends the script with the step's exit status, no traceback.
    """
    command = "txl " + " ".join(shlex.quote(a) for a in argv)
    print("$ " + command, flush=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "txl", *argv])
    if done.returncode:
        sys.exit(f"txl_studies.summaries.run: the step failed (exit status {done.returncode}): {command}")
    return time.perf_counter() - start


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m txl_studies.summaries.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/docstrings-split4", help="folder for the data, runs and summaries")
    ap.add_argument("--data-args", default="--split 0.5,0.1,0.4 --short-train --package-train --package-pretrain",
                    help="txl data docstrings arguments (the data step)")
    ap.add_argument("--lm", help="an existing language-model run to fine-tune (default: pre-train WORK/lm)")
    ap.add_argument("--lm-args", default="--config studies/summaries/docstrings-lm.toml -q",
                    help="txl train arguments (pre-training; not --out, which this script gives)")
    ap.add_argument("--ft-args", default="--config studies/summaries/summarize-docstrings.toml -q",
                    help="txl finetune arguments (not --init, --out, data.train, data.valid or train.seed, which this "
                         "script gives)")
    ap.add_argument("--summarize-args", default="--no-repeat-ngram-size 3 --repetition-penalty 1.2",
                    help="more txl summarize arguments (both readings; not --out, --max-new-tokens or "
                         "--prompt-tokens, which this script gives)")
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds")
    ap.add_argument("--train", default="train-with-packages.jsonl",
                    help="the pairs file of WORK/data to fine-tune on (train.jsonl: the long documents only)")
    ap.add_argument("--json", help="write the results here")
    return ap


def _summaries(args, work: Path, data: Path, lm: Path, test: list[dict], times: dict) -> tuple[dict, dict]:
    """Fine-tune each seed and summarize the test documents both ways (the steps whose output exists are
    skipped); the summaries by system (``b0``, ``c0``, ...) and the share of each that ended."""
    import numpy as np

    preds, ended = {}, {}
    for seed in range(args.seeds):
        ft = work / f"ft-seed{seed}"
        if not (ft / "best").is_dir():
            times[f"finetune seed {seed}"] = txl(
                "finetune", "--init", str(lm), "--out", str(ft), f"data.train={data / args.train}",
                f"data.valid={data / 'valid.jsonl'}", f"train.seed={seed}", *shlex.split(args.ft_args))
        tgt_len = json.loads((ft / "best" / "config.json").read_text())["tgt_len"]
        for key, extra in (("b", ["--prompt-tokens", str(tgt_len)]), ("c", [])):
            out = work / f"summaries-{key}-seed{seed}.jsonl"
            if not out.is_file():
                times[f"{key} seed {seed}"] = txl(
                    "summarize", str(ft), str(data / "test.jsonl"), "--out", str(out), "--max-new-tokens",
                    str(args.max_new_tokens), *extra, *shlex.split(args.summarize_args))
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            preds[f"{key}{seed}"] = [r["summary"] for r in rows]
            ended[f"{key}{seed}"] = float(np.mean([r.get("ended", False) for r in rows]))
    return preds, ended


def _interval(*arrays) -> dict:
    """The mean of one array of per-document scores, or of the difference of two, with its 95% bootstrap
    interval over the documents."""
    import numpy as np

    from txl.evaluation.intervals import bootstrap_interval

    stat = (lambda *xs: float(np.mean(xs[0] - xs[1]))) if len(arrays) == 2 else (lambda *xs: float(np.mean(xs[0])))
    iv = bootstrap_interval(arrays if len(arrays) > 1 else arrays[0], stat, n=2000, seed=0)
    return {"estimate": iv.estimate, "low": iv.low, "high": iv.high}


def _by_length(results: dict, args, work: Path, test: list[dict], per: dict) -> None:
    """ROUGE-L by the document's length in tokens (mean over the seeds for (b) and (c)): where the memory
    matters; and the mean over the seeds of each document's ROUGE-L against the baselines."""
    import numpy as np

    from txl.training.checkpoint import load_checkpoint

    tokenizer = load_checkpoint(work / "ft-seed0").tokenizer
    n_tokens = np.array([len(tokenizer.encode(t["prompt"])) for t in test])
    results["document_tokens"] = {"min": int(n_tokens.min()), "median": float(np.median(n_tokens)),
                                  "max": int(n_tokens.max())}
    seeds = range(args.seeds)
    mean_of = {"a": per["a"], "b": np.mean([per[f"b{s}"] for s in seeds], 0),
               "c": np.mean([per[f"c{s}"] for s in seeds], 0)}
    # the mean over the seeds of each document's ROUGE-L, against the baselines (intervals over the test documents)
    results["mean_of_seeds"] = {"rougeL": {k: float(v.mean()) for k, v in mean_of.items()},
                                "c_minus_a": _interval(mean_of["c"], mean_of["a"]),
                                "c_minus_b": _interval(mean_of["c"], mean_of["b"])}
    results["by_document_tokens"] = []
    for lo, hi in ((0, 256), (256, 512), (512, 1024), (1024, None)):
        sel = (n_tokens >= lo) & (n_tokens < (hi or np.inf))
        if sel.any():
            row = {"tokens": [lo, hi], "documents": int(sel.sum()),
                   "rougeL": {k: float(v[sel].mean()) for k, v in mean_of.items()}}
            if sel.sum() >= 10:
                row["c_minus_a"] = _interval(mean_of["c"][sel], mean_of["a"][sel])
                row["c_minus_b"] = _interval(mean_of["c"][sel], mean_of["b"][sel])
            results["by_document_tokens"].append(row)


def main() -> int:
    import numpy as np

    from txl_recipes.summarize.rouge import rouge_scores
    from txl_studies.summaries.data import name_words

    args = _parser().parse_args()
    work = Path(args.work)
    data, lm = work / "data", Path(args.lm) if args.lm else work / "lm"
    times: dict = {}
    if not (data / "test.jsonl").is_file():
        times["data"] = txl("data", "docstrings", "--out", str(data), *shlex.split(args.data_args))
    if not (lm / "best").is_dir():
        times["pretrain"] = txl("train", str(data / "pretrain"), "--out", str(lm), *shlex.split(args.lm_args))
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    refs = [t["completion"] for t in test]
    preds = {"a": [name_words(t["name"]) for t in test]}
    seeded, ended = _summaries(args, work, data, lm, test, times)
    preds.update(seeded)
    scores = {k: rouge_scores(p, refs) for k, p in preds.items()}
    per = {k: np.array([p["rougeL"] for p in s["per_pair"]]) for k, s in scores.items()}

    earlier = {}  # the wall times of steps an earlier run of this script did (and this one skipped)
    if args.json and Path(args.json).is_file():
        earlier = json.loads(Path(args.json).read_text()).get("wall_s", {})
    threads = os.environ.get("OMP_NUM_THREADS")
    results = {"command": (f"OMP_NUM_THREADS={threads} " if threads else "") + "python -m txl_studies.summaries.run "
               + shlex.join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
               "test_documents": len(test), "wall_s": {**earlier, **{k: round(v) for k, v in times.items()}},
               "systems": {},
               "seeds": args.seeds, "summarize_args": args.summarize_args, "max_new_tokens": args.max_new_tokens}
    for k, s in scores.items():
        results["systems"][k] = {**{t: s[t] for t in ("rouge1", "rouge2", "rougeL")},
                                 "rougeL_interval": _interval(per[k]), "distinct": len(set(preds[k])),
                                 "ended": ended.get(k)}
        if k != "a":
            results["systems"][k]["minus_a"] = _interval(per[k], per["a"])
        if k.startswith("c"):
            results["systems"][k]["minus_b"] = _interval(per[k], per["b" + k[1:]])
    # where the results come from: the split, the language model, the fine-tuning runs' best steps
    results["pairs"] = json.loads((data / "split.json").read_text())["pairs"]
    lm_state = json.loads((lm / "best" / "state.json").read_text())
    results["lm"] = {k: lm_state.get(k) for k in ("step", "tokens", "elapsed_s", "val_loss", "val_metric", "unit")}
    best = [json.loads((work / f"ft-seed{s}" / "best" / "state.json").read_text()) for s in range(args.seeds)]
    results["finetune_best_step"] = [b["step"] for b in best]
    results["finetune_best_valid"] = [{"value": b.get("val_metric"), "unit": b.get("unit")} for b in best]
    _by_length(results, args, work, test, per)
    results["examples"] = []
    order = sorted(range(len(test)), key=lambda i: -per["c0"][i])
    for i in order[:4] + order[-3:]:
        results["examples"].append({"name": test[i]["name"], "module": test[i]["module"], "reference": refs[i],
                                    "a": preds["a"][i], "b": preds["b0"][i], "c": preds["c0"][i],
                                    "rougeL_c": round(float(per["c0"][i]), 3)})
    print(json.dumps({k: {m: v for m, v in s.items()} for k, s in results["systems"].items()}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0

if __name__ == "__main__":
    sys.exit(main())
