"""Long-document classification: which reading of a document classifies it best?

On ``txl data packages`` (standard-library source by package; 14 classes; train/valid/test split by
file), fine-tunes one language model as a classifier in each reading, with the same steps and batch
for every row, for several seeds, and scores the test documents:

- ``memory``: the reading of ``--config`` as it is (the package benchmark's row);
- ``document``: the whole document, segment by segment with the memory, every segment's states
  pooled into one running mean (``--pooling document``, the default reading);
- ``attention``: the same with a learnt softmax over every state (``--pooling attention``);
- ``two-pass``: ERNIE-Doc's retrospective feed, the document read twice, the second reading from
  the memory the first left, with same-layer memory (``--passes 2 --recurrence same_layer``);
- ``same-layer``: ERNIE-Doc's enhanced recurrence (``--recurrence same_layer``), every segment pooled;
- ``memory-last``: the whole document with the memory, only its last segment pooled (``--pooling
  mean``: what a state there reaches, ``n_layer x mem_len`` tokens back at most);
- ``first`` / ``last``: its first / last segment only;
- ``window``: one window of ``--window`` tokens from its start, no memory (the vanilla
  Transformer's reading, §3.1, with the same weights);
- TF-IDF + logistic regression (scikit-learn), the baseline a practitioner tries first, on word
  1-2-grams (``tfidf``) and on character 2-4-grams (``tfidf-char``).

Prints and writes (``--json``) accuracy and macro-F1 per row and seed with 95% bootstrap intervals
over the test documents, each row's predictions, its accuracy per class and per document length
(quartiles of the test documents' tokens), the mean over seeds, and paired intervals of the
``--reference`` row minus each other row of the same seed.

    OMP_NUM_THREADS=2 python -m txl_studies.classification.run --lm runs/docstrings/lm \\
        --work runs/packages --json benchmarks/results/classification-packages-shared-loop.json
    OMP_NUM_THREADS=2 python -m txl_studies.classification.run --lm runs/lm-main --work runs/longdocs \\
        --config studies/classification/classify-long.toml --data-args "--doc-bytes 4096 --min-bytes 2048 --max-per-class 100" \\
        --rows document,attention,two-pass,same-layer,memory-last,first,last,window --reference document \\
        --json benchmarks/results/classification-long.json

A classifier already in ``--work`` with the same settings is scored, not trained again, so a stopped
run picks up where it stopped. ``--rows`` and ``--first-seed``/``--seeds`` run a part (for example
two processes of one thread, one memory seed each), and ``--merge FILE`` adds the rows of an earlier
run's JSON (same data folder) to this one's, pairing them by seed where their predictions are kept.

Needs scikit-learn (the ``bench`` extra) for the TF-IDF rows.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # this study's folder: its configs


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


def report(path: str) -> str:
    """Markdown tables of a JSON this script wrote: accuracy [95% interval] / macro-F1 per row and seed, the
    mean; the reference row minus each other row, paired, per seed; accuracy per length quartile and per
    class (means over seeds)."""
    import numpy as np

    results = json.loads(Path(path).read_text())
    rows, ref = results["rows"], results.get("reference", "memory")
    names = list(dict.fromkeys(k.split("/")[0] for k in rows))
    seeds = sorted({k.split("/")[1] for k in rows}, key=lambda s: int(s.removeprefix("seed")))

    def cell(key: str) -> str:
        row = rows.get(key)
        if row is None:
            return ""
        a = row["accuracy"]
        return f"{a['estimate']:.3f} [{a['low']:.3f}, {a['high']:.3f}] / {row['macro_f1']['estimate']:.3f}"

    def mean(name: str, metric: str) -> float:
        return float(np.mean([rows[f"{name}/{s}"][metric]["estimate"] for s in seeds if f"{name}/{s}" in rows]))

    lines = ["| row | " + " | ".join(seeds) + " | mean |", "|---" * (len(seeds) + 2) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(f"{name}/{s}") for s in seeds)
                     + f" | {mean(name, 'accuracy'):.3f} / {mean(name, 'macro_f1'):.3f} |")
    lines += ["", f"| {ref} minus | " + " | ".join(seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for name in names:
        if name == ref:
            continue
        diffs = [rows.get(f"{ref}/{s}", {}).get(f"minus_{name}") for s in seeds]
        lines.append(f"| {name} | " + " | ".join(
            "" if d is None else f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]" for d in diffs) + " |")
    buckets = results.get("length_buckets")
    if buckets:
        edges = buckets["edges_tokens"]
        spans = [f"< {edges[0]}"] + [f"{a}-{b - 1}" for a, b in zip(edges, edges[1:])] + [f">= {edges[-1]}"]
        lines += ["", "| row (mean over seeds) | " + " | ".join(
            f"{span} tokens ({n})" for span, n in zip(spans, buckets["documents"])) + " |", "|---" * 5 + "|"]
        for name in names:
            by = np.mean([rows[f"{name}/{s}"]["by_length"] for s in seeds if f"{name}/{s}" in rows], axis=0)
            lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in by) + " |")
        classes = results["classes"]
        lines += ["", "| row (mean over seeds) | " + " | ".join(classes) + " |", "|---" * (len(classes) + 1) + "|"]
        for name in names:
            keys = [f"{name}/{s}" for s in seeds if f"{name}/{s}" in rows]
            lines.append(f"| {name} | " + " | ".join(
                f"{np.mean([rows[k]['by_class'][c] for k in keys]):.2f}" for c in classes) + " |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    """This script's flags (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm", help="the language-model run to fine-tune (needed but with --report); trained first "
                                 "with txl train --out LM and --lm-args when that path does not exist")
    ap.add_argument("--lm-args", default="", help="more arguments of txl train, when it trains --lm (default: none, "
                                                  "the default model on the built-in corpus)")
    ap.add_argument("--work", default="runs/packages", help="folder for the data and the classifiers")
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds, from --first-seed on")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rows", default="memory,first,last,window", help="which fine-tuned rows to run")
    ap.add_argument("--reference", default="memory", help="the row whose paired differences with the others are kept")
    ap.add_argument("--data-args", default="", help="more arguments of txl data packages, when it builds the data")
    ap.add_argument("--merge", help="a JSON this script wrote for other seeds or rows: its rows join this one's")
    ap.add_argument("--config", default=str(HERE / "classify-packages.toml"),
                    help="the txl classify train settings of every row (the memory row's as they are; the other "
                         "rows change the reading only)")
    ap.add_argument("--steps", type=int, help="(default: the config's)")
    ap.add_argument("--batch-size", type=int, help="(default: the config's)")
    ap.add_argument("--tgt-len", type=int, help="(default: the config's)")
    ap.add_argument("--mem-len", type=int, help="(default: the config's)")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--lr", type=float, help="(default: the config's)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--report", metavar="JSON", help="print the markdown tables of a JSON this script wrote, and stop")
    return ap.parse_args()


def row_readings(args: argparse.Namespace, shared: argparse.Namespace) -> tuple[dict, dict]:
    """Each row's ``txl classify train`` flags (the shared settings with its own reading: one segment or
    window has no memory to carry) and the settings a kept classifier of that row must show (the LM's
    tgt_len when neither file nor flag sets one)."""
    memory = ["--mode", "memory"]
    rows = {
        "memory": memory,
        "document": [*memory, "--pooling", "document"],
        "attention": [*memory, "--pooling", "attention"],
        "two-pass": [*memory, "--pooling", "document", "--passes", "2", "--recurrence", "same_layer"],
        "same-layer": [*memory, "--pooling", "document", "--recurrence", "same_layer"],
        "memory-last": [*memory, "--pooling", "mean"],
        "first": ["--mode", "first"],
        "last": ["--mode", "last"],
        "window": ["--mode", "first", "--tgt-len", str(args.window), "--mem-len", "0"],
    }
    whole = {"mode": "memory", "tgt_len": shared.tgt_len, "mem_len": shared.mem_len, "head_init": shared.head_init,
             "grad_segments": shared.grad_segments or None}  # (0, all segments: kept as None)
    one = {"pooling": shared.pooling, "head_init": shared.head_init}
    reading = {"memory": {**whole, "pooling": shared.pooling, "passes": shared.passes, "recurrence": shared.recurrence},
               "document": {**whole, "pooling": "document", "passes": 1, "recurrence": "previous_layer"},
               "attention": {**whole, "pooling": "attention", "passes": 1, "recurrence": "previous_layer"},
               "two-pass": {**whole, "pooling": "document", "passes": 2, "recurrence": "same_layer"},
               "same-layer": {**whole, "pooling": "document", "passes": 1, "recurrence": "same_layer"},
               "memory-last": {**whole, "pooling": "mean", "passes": 1, "recurrence": "previous_layer"},
               "first": {"mode": "first", "tgt_len": shared.tgt_len, **one},
               "last": {"mode": "last", "tgt_len": shared.tgt_len, **one},
               "window": {"mode": "first", "tgt_len": args.window, "mem_len": 0, **one}}
    return rows, reading


def fit_rows(args, shared, given: dict, data: Path, test: list, labels: list, seeds: list, times: dict) -> dict:
    """Train (or find, with the same settings, in ``--work``) each row's classifier for each seed and
    return its held-out predictions, ``{"row/seedN": int array of label indices}`` in test.jsonl's order;
    each training's wall time goes to ``times``."""
    import numpy as np

    from txl.config import SAVED_WITHOUT

    rows, reading = row_readings(args, shared)
    unknown = set(args.rows.split(",")) - set(rows)
    if unknown:
        raise SystemExit(f"--rows: no row {', '.join(sorted(unknown))}; choose from {', '.join(rows)}")
    given_flags = {f"--{k.replace('_', '-')}": v for k, v in given.items() if v is not None}
    common = ["--config", args.config, "--data", str(data / "train.jsonl"), "--valid", str(data / "test.jsonl"), "-q"]
    preds: dict = {}
    for name in dict.fromkeys(args.rows.split(",")):  # in the order given
        flags = rows[name]
        for seed in seeds:
            out = Path(args.work) / f"{name}-seed{seed}"
            if not (out / "heldout.json").is_file():
                own = dict(zip(flags[::2], flags[1::2]))  # the row's flags replace the shared ones (each flag once)
                shared_flags = [str(item) for flag, value in given_flags.items() if flag not in own
                                for item in (flag, value)]
                times[f"{name}/seed{seed}"] = txl("classify", "train", args.lm, "--out", str(out), "--seed",
                                                  str(seed), *common, *shared_flags, *flags)
            extra = json.loads((out / "heldout.json").read_text())  # the run's held-out report
            settings = extra["settings"]  # a kept classifier must have this run's settings
            wanted = {"steps": shared.steps, "batch_size": shared.batch_size, "lr": shared.lr, "seed": seed,
                      **reading[name]}
            # (mode, pooling, grad_segments, passes, recurrence, head_init are the head's)
            found = {**SAVED_WITHOUT, **settings, **settings.get("classifier", {})}
            stale = [k for k, v in wanted.items() if found.get(k) != v and (v is not None or k == "grad_segments")]
            if stale or not str(settings.get("checkpoint", "")).startswith(str(Path(args.lm))):
                raise SystemExit(f"{out} was trained with other settings ({', '.join(stale) or 'checkpoint'}); "
                                 "remove it or give another --work")
            predicted = extra["heldout_predictions"]  # in the order of --valid, test.jsonl's
            assert len(predicted) == len(test), (out, len(predicted))
            preds[f"{name}/seed{seed}"] = np.array([labels.index(p) for p in predicted])
    return preds


def add_baselines(train: list, test: list, labels: list, seeds: list, preds: dict, times: dict) -> None:
    """TF-IDF + logistic regression on words and on characters: their predictions go to ``preds`` under
    every seed (lbfgs is deterministic: one fit serves every seed; the rows are paired seed by seed)."""
    import numpy as np

    from txl_studies.classification.baselines import tfidf_baseline

    for name, analyzer in (("tfidf", "word"), ("tfidf-char", "char_wb")):
        start = time.perf_counter()
        got = tfidf_baseline([t["text"] for t in train], [t["label"] for t in train], [t["text"] for t in test],
                             seed=0, analyzer=analyzer)
        times[name] = time.perf_counter() - start
        for seed in seeds:
            preds[f"{name}/seed{seed}"] = np.array([labels.index(p) for p in got])


def merge_rows(path: str, results: dict, preds: dict, n_test: int, labels: list) -> None:
    """Add the rows of an earlier run's JSON (``--merge``), kept as they were, to ``results``; their kept
    predictions go to ``preds`` so that they pair with this run's rows of the same seed."""
    import numpy as np

    merged = json.loads(Path(path).read_text())
    if merged.get("test_documents") != n_test or merged.get("classes") != labels:
        raise SystemExit(f"--merge {path}: another test set or class list; merge runs of one data folder")
    taken = {k: v for k, v in merged["rows"].items() if k not in preds}
    results["merged_from"] = {"file": path, "rows": sorted(taken)}
    results["rows"].update(taken)
    results["wall_s"] = {**merged.get("wall_s", {}), **results["wall_s"]}
    for key, row in taken.items():
        if "predictions" in row:
            preds[key] = np.array([labels.index(q) for q in row["predictions"]])


def score_rows(results: dict, preds: dict, y, labels: list, n_tokens, reference: str) -> None:
    """Each row's accuracy and macro-F1 with bootstrap intervals, per class and per length quartile (in the
    LM's tokens), the ``reference`` row's paired differences with every other row of its seed, and the
    mean over seeds, into ``results``."""
    import numpy as np

    from txl.evaluation.intervals import accuracy, bootstrap_interval, macro_f1

    def interval(stat, *arrays):
        iv = bootstrap_interval(tuple(arrays), stat, n=2000, seed=0)
        return {"estimate": iv.estimate, "low": iv.low, "high": iv.high}

    edges = [int(e) for e in np.quantile(n_tokens, [0.25, 0.5, 0.75])]
    bucket = np.searchsorted(edges, n_tokens, side="right")
    results["length_buckets"] = {"edges_tokens": edges, "documents": np.bincount(bucket, minlength=4).tolist(),
                                 "tokens": {"min": int(n_tokens.min()), "median": int(np.median(n_tokens)),
                                            "max": int(n_tokens.max())}}
    for key, p in preds.items():
        if key not in results["rows"]:
            results["rows"][key] = {"accuracy": interval(lambda t, q: accuracy(t, q), y, p),
                                    "macro_f1": interval(lambda t, q: macro_f1(t, q), y, p),
                                    "predictions": [labels[i] for i in p]}
        row = results["rows"][key]
        row["by_class"] = {c: float((p[y == i] == i).mean()) for i, c in enumerate(labels) if (y == i).any()}
        row["by_length"] = [float((p[bucket == b] == y[bucket == b]).mean()) for b in range(4)]
        name, seed = key.split("/")
        if name == reference:
            for other in dict.fromkeys(k.split("/")[0] for k in preds):  # this run's rows and merged ones
                if other != name and f"{other}/{seed}" in preds and f"minus_{other}" not in row:
                    row[f"minus_{other}"] = interval(
                        lambda t, a, b: accuracy(t, a) - accuracy(t, b), y, p, preds[f"{other}/{seed}"])
    by_name: dict = {}
    for key in results["rows"]:
        by_name.setdefault(key.split("/")[0], []).append(key)
    results["mean_over_seeds"] = {
        name: {"seeds": len(keys), **{
            metric: {"mean": float(np.mean(vals)), "min": float(np.min(vals)), "max": float(np.max(vals))}
            for metric in ("accuracy", "macro_f1")
            for vals in [[results["rows"][k][metric]["estimate"] for k in keys]]}}
        for name, keys in by_name.items()}


def main() -> int:
    import os

    import numpy as np
    import torch

    from txl_recipes.classify.command import TRAIN_SETTINGS, resolve_settings
    from txl.data import load_tokenizer
    from txl.errors import TxlError
    from txl.runtime import cpu_flags

    args = parse_args()
    if args.report:
        print(report(args.report))
        return 0
    if not args.lm:
        raise SystemExit("--lm: give the language-model run to fine-tune")
    if args.merge and not Path(args.merge).is_file():  # said before hours of training, not after
        raise SystemExit(f"--merge: {args.merge} is not a file; give a JSON this script wrote")
    data = Path(args.work) / "data"
    times: dict = {}
    if not Path(args.lm).exists():  # one command from nothing: the language model first
        times["lm"] = txl("train", "--out", args.lm, *shlex.split(args.lm_args))
    if not (data / "test.jsonl").is_file():
        times["data"] = txl("data", "packages", "--out", str(data), *shlex.split(args.data_args))
    given = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
             "tgt_len": args.tgt_len, "mem_len": args.mem_len}
    shared = argparse.Namespace(**{**dict.fromkeys(TRAIN_SETTINGS), **given, "config": args.config, "valid": "test"})
    try:  # the settings every row shares: the config file's, with this script's flags over them
        resolve_settings(shared)
    except TxlError as err:
        raise SystemExit(f"--config: {err}") from None
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    labels = sorted({t["label"] for t in train})
    y = np.array([labels.index(t["label"]) for t in test])
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    preds = fit_rows(args, shared, given, data, test, labels, seeds, times)
    add_baselines(train, test, labels, seeds, preds, times)
    results = {"test_documents": len(test), "classes": labels, "steps": shared.steps,
               "batch_size": shared.batch_size, "reference": args.reference, "data_args": args.data_args,
               "lm": str(args.lm), "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
               "date": time.strftime("%Y-%m-%d"), "lr": shared.lr,
               "config": {k: getattr(shared, k) for k in TRAIN_SETTINGS},
               "wall_s": {k: round(v) for k, v in times.items()}, "rows": {},
               "machine": {"cpus": os.cpu_count(), "cpu_flags": sorted(cpu_flags() or ()), "torch": torch.__version__,
                           "threads": os.environ.get("OMP_NUM_THREADS")}}
    if args.merge:
        merge_rows(args.merge, results, preds, len(test), labels)
    # where the errors are: accuracy per class and per quartile of the test documents' length in the LM's tokens
    tokenizer = load_tokenizer(Path(args.lm) / "best" / "vocab.json")
    n_tokens = np.array([len(tokenizer.encode(t["text"])) for t in test])
    score_rows(results, preds, y, labels, n_tokens, args.reference)
    print(json.dumps(results["mean_over_seeds"], indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
