"""Long-document classification: does reading the whole document with the memory beat one segment?

On ``txl data packages`` (standard-library source by package; 14 classes; train/valid/test split by
file), fine-tunes one language model as a classifier in each reading, with the same steps and batch
for every row, for several seeds, and scores the test documents:

- (a) ``memory``: the whole document, segment by segment, with a memory that reaches all of it;
- (b) ``first``: its first segment only;
- (c) ``last``: its last segment only;
- (d) ``window``: one window of ``--window`` tokens from its start, no memory (the vanilla
  Transformer's reading, §3.1, with the same weights);
- (e) TF-IDF + logistic regression (scikit-learn), the baseline a practitioner tries first, on word
  1-2-grams (``tfidf``) and on character 2-4-grams (``tfidf-char``).

Prints and writes (``--json``) accuracy and macro-F1 per row and seed with 95% bootstrap intervals
over the test documents, each row's predictions, the mean over seeds, and paired intervals of (a)
minus each other row of the same seed.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/classification.py --lm runs/docstrings/lm \\
        --work runs/packages --mem-len 512 --json benchmarks/results/classification-packages.json

A classifier already in ``--work`` with the same settings is scored, not trained again, so a stopped
run picks up where it stopped. ``--rows`` and ``--first-seed``/``--seeds`` run a part (for example
two processes of one thread, one memory seed each), and ``--merge FILE`` adds the rows of an earlier
run's JSON (same data folder) to this one's, pairing them by seed where their predictions are kept.

Needs scikit-learn (the ``bench`` extra) for row (e).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def txl(*argv: str) -> float:
    """Run ``txl ARGV`` in this process (this checkout's), echoing the command; returns its wall time in
    seconds, or stops the benchmark with the command's exit status when it fails."""
    from txl.cli import main as txl_main

    print("$ txl " + " ".join(shlex.quote(a) for a in argv), flush=True)
    start = time.perf_counter()
    status = txl_main(list(argv))
    if status:
        raise SystemExit(status)
    return time.perf_counter() - start


def main() -> int:
    import numpy as np

    from txl.classification.baselines import tfidf_baseline
    from txl.evaluation.intervals import accuracy, bootstrap_interval, macro_f1

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm", required=True, help="the language-model run to fine-tune")
    ap.add_argument("--work", default="runs/packages", help="folder for the data and the classifiers")
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds, from --first-seed on")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rows", default="memory,first,last,window", help="which fine-tuned rows to run")
    ap.add_argument("--merge", help="a JSON this script wrote for other seeds or rows: its rows join this one's")
    ap.add_argument("--config", default=str(ROOT / "configs" / "classify-packages.toml"),
                    help="the txl classify train settings of every row (the memory row's as they are; the other "
                         "rows change the reading only)")
    ap.add_argument("--steps", type=int, help="(default: the config's)")
    ap.add_argument("--batch-size", type=int, help="(default: the config's)")
    ap.add_argument("--tgt-len", type=int, help="(default: the config's)")
    ap.add_argument("--mem-len", type=int, help="(default: the config's)")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--lr", type=float, help="(default: the config's)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.merge and not Path(args.merge).is_file():  # said before hours of training, not after
        raise SystemExit(f"--merge: {args.merge} is not a file; give a JSON this script wrote")
    work = Path(args.work)
    data = work / "data"
    times: dict = {}
    if not (data / "test.jsonl").is_file():
        times["data"] = txl("data", "packages", "--out", str(data))
    from txl.cli.classify import TRAIN_SETTINGS, resolve_settings
    from txl.errors import TxlError

    given = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
             "tgt_len": args.tgt_len, "mem_len": args.mem_len}
    shared = argparse.Namespace(**{**dict.fromkeys(TRAIN_SETTINGS), **given, "config": args.config, "valid": "test"})
    try:  # the settings every row shares: the config file's, with this script's flags over them
        resolve_settings(shared)
    except TxlError as err:
        raise SystemExit(f"--config: {err}") from None
    steps, batch_size, lr = shared.steps, shared.batch_size, shared.lr
    rows = {  # each row is the shared settings with its own reading (one segment or window: no memory to carry)
        "memory": ["--mode", "memory"],
        "first": ["--mode", "first"],
        "last": ["--mode", "last"],
        "window": ["--mode", "first", "--tgt-len", str(args.window), "--mem-len", "0"],
    }
    # what a kept classifier's settings must show for each row (the LM's tgt_len when neither file nor flag sets one)
    reading = {"memory": {"mode": "memory", "tgt_len": shared.tgt_len, "mem_len": shared.mem_len,
                          "grad_segments": shared.grad_segments or None},  # (0, all segments: kept as None)
               "first": {"mode": "first", "tgt_len": shared.tgt_len}, "last": {"mode": "last", "tgt_len": shared.tgt_len},
               "window": {"mode": "first", "tgt_len": args.window, "mem_len": 0}}
    given = {f"--{k.replace('_', '-')}": v for k, v in given.items() if v is not None}
    common = ["--config", args.config, "--data", str(data / "train.jsonl"), "--valid", str(data / "test.jsonl"),
              *[str(item) for pair in given.items() for item in pair], "-q"]
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    labels = sorted({t["label"] for t in train})
    y = np.array([labels.index(t["label"]) for t in test])
    unknown = set(args.rows.split(",")) - set(rows)
    if unknown:
        raise SystemExit(f"--rows: no row {', '.join(sorted(unknown))}; choose from {', '.join(rows)}")
    rows = {name: flags for name, flags in rows.items() if name in args.rows.split(",")}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    preds: dict = {}
    for name, flags in rows.items():
        for seed in seeds:
            out = work / f"{name}-seed{seed}"
            if not (out / "heldout.json").is_file():
                times[f"{name}/seed{seed}"] = txl("classify", "train", args.lm, "--out", str(out), "--seed",
                                                  str(seed), *common, *flags)
            extra = json.loads((out / "heldout.json").read_text())  # the run's held-out report
            settings = extra["settings"]  # a classifier kept from an earlier run must match this one
            wanted = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "pooling": shared.pooling,
                      **reading[name]}
            found = {**settings, **settings.get("classifier", {})}  # (mode, pooling, grad_segments are the head's)
            stale = [k for k, v in wanted.items() if found.get(k) != v and (v is not None or k == "grad_segments")]
            if stale or not str(settings.get("checkpoint", "")).startswith(str(Path(args.lm))):
                raise SystemExit(f"{out} was trained with other settings ({', '.join(stale) or 'checkpoint'}); "
                                 "remove it or give another --work")
            predicted = extra["heldout_predictions"]  # in the order of --valid, test.jsonl's
            assert len(predicted) == len(test), (out, len(predicted))
            preds[f"{name}/seed{seed}"] = np.array([labels.index(p) for p in predicted])
    for name, analyzer in (("tfidf", "word"), ("tfidf-char", "char_wb")):
        # lbfgs is deterministic: one fit serves every seed (the rows are paired seed by seed)
        start = time.perf_counter()
        got = tfidf_baseline([t["text"] for t in train], [t["label"] for t in train], [t["text"] for t in test],
                             seed=0, analyzer=analyzer)
        times[name] = time.perf_counter() - start
        for seed in seeds:
            preds[f"{name}/seed{seed}"] = np.array([labels.index(p) for p in got])

    def interval(stat, *arrays):
        iv = bootstrap_interval(tuple(arrays), stat, n=2000, seed=0)
        return {"estimate": iv.estimate, "low": iv.low, "high": iv.high}

    import os

    import torch

    from txl.runtime import cpu_flags

    results = {"test_documents": len(test), "classes": labels, "steps": steps, "batch_size": batch_size,
               "lr": lr, "config": {k: getattr(shared, k) for k in TRAIN_SETTINGS},
               "wall_s": {k: round(v) for k, v in times.items()}, "rows": {},
               "machine": {"cpus": os.cpu_count(), "cpu_flags": sorted(cpu_flags() or ()), "torch": torch.__version__,
                           "threads": os.environ.get("OMP_NUM_THREADS")}}
    if args.merge:  # rows measured by another run (other seeds or rows), kept as they were
        merged = json.loads(Path(args.merge).read_text())
        if merged.get("test_documents") != len(test) or merged.get("classes") != labels:
            raise SystemExit(f"--merge {args.merge}: another test set or class list; merge runs of one data folder")
        taken = {k: v for k, v in merged["rows"].items() if k not in preds}
        results["merged_from"] = {"file": args.merge, "rows": sorted(taken)}
        results["rows"].update(taken)
        results["wall_s"] = {**merged.get("wall_s", {}), **results["wall_s"]}
        for key, row in taken.items():  # their predictions pair them with this run's rows of the same seed
            if "predictions" in row:
                preds[key] = np.array([labels.index(q) for q in row["predictions"]])
    for key, p in preds.items():
        if key not in results["rows"]:
            results["rows"][key] = {"accuracy": interval(lambda t, q: accuracy(t, q), y, p),
                                    "macro_f1": interval(lambda t, q: macro_f1(t, q), y, p),
                                    "predictions": [labels[i] for i in p]}
        name, seed = key.split("/")
        if name == "memory":
            for other in ("first", "last", "window", "tfidf", "tfidf-char"):
                if f"{other}/{seed}" in preds:
                    results["rows"][key][f"minus_{other}"] = interval(
                        lambda t, a, b: accuracy(t, a) - accuracy(t, b), y, p, preds[f"{other}/{seed}"])
    estimates = results["rows"]
    by_name: dict = {}
    for key in estimates:
        by_name.setdefault(key.split("/")[0], []).append(key)
    results["mean_over_seeds"] = {
        name: {"seeds": len(keys), **{
            metric: {"mean": float(np.mean(vals)), "min": float(np.min(vals)), "max": float(np.max(vals))}
            for metric in ("accuracy", "macro_f1")
            for vals in [[estimates[k][metric]["estimate"] for k in keys]]}}
        for name, keys in by_name.items()}
    print(json.dumps(results["mean_over_seeds"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
