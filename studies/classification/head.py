"""How the classifier's head starts, on the long-document benchmark's data: a linear probe or a random head.

Rows, all with the whole-document reading of ``studies/classification/classify-long.toml`` (``--pooling document``,
``--grad-segments 2``), seed 0, scored on the test documents with 95% bootstrap intervals over them:

- ``probe-only``: the head fitted by the linear probe over the training documents' pooled vectors
  (:func:`txl_recipes.classify.probe.probe_head`), no fine-tuning at all;
- ``random-lr1e-4``, ``random-lr5e-4``: a random head (``--head-init random``), fine-tuned ``--steps``
  steps at that learning rate;
- ``probe-lr1e-4`` (the benchmark's ``document`` row of seed 0), ``probe-lr5e-4``: the probe's head,
  then fine-tuned ``--steps`` steps at that learning rate.

    OMP_NUM_THREADS=2 python -m txl_studies.classification.head --lm runs/lm-main \\
        --work runs/longdocs --json benchmarks/results/classification-long-head.json

``--work`` holds the data of ``txl_studies.classification.run`` (``WORK/data``, built there first); a run
already in ``WORK/head-ROW`` is scored, not trained again.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # this study's folder: its configs

RUNS = {"random-lr1e-4": ("random", 1e-4), "random-lr5e-4": ("random", 5e-4), "probe-lr1e-4": ("probe", 1e-4),
        "probe-lr5e-4": ("probe", 5e-4)}


def main() -> int:
    import numpy as np

    from txl.classification import TransformerXLForSequenceClassification
    from txl_recipes.classify.probe import probe_head
    from txl.classification.data import encode_texts
    from txl_recipes.classify.train import predict_labels
    from txl.cli import main as txl_main
    from txl.evaluation.intervals import accuracy, bootstrap_interval, macro_f1

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm", required=True, help="the language-model run (txl train's main job)")
    ap.add_argument("--work", default="runs/longdocs", help="the folder of txl_studies.classification.run's data")
    ap.add_argument("--config", default=str(HERE / "classify-long.toml"))
    ap.add_argument("--steps", type=int, default=50, help="fine-tuning steps of the fine-tuned rows (the config's)")
    ap.add_argument("--rows", default="probe-only," + ",".join(RUNS))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work, data = Path(args.work), Path(args.work) / "data"
    if not (data / "test.jsonl").is_file():
        raise SystemExit(f"{data}: no test.jsonl; build the data with txl_studies.classification.run first")
    test = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    labels = sorted({t["label"] for t in train})
    y = np.array([labels.index(t["label"]) for t in test])
    rows, wall = {}, {}

    def scored(pred) -> dict:
        out = {}
        for name, stat in (("accuracy", accuracy), ("macro_f1", macro_f1)):
            iv = bootstrap_interval((y, pred), lambda t, q, s=stat: s(t, q), n=2000, seed=0)
            out[name] = {"estimate": iv.estimate, "low": iv.low, "high": iv.high}
        return out

    for name in args.rows.split(","):
        start, kept = time.perf_counter(), False
        if name == "probe-only":
            model = TransformerXLForSequenceClassification.from_pretrained_lm(
                args.lm, len(labels), labels=labels, mode="memory", pooling="document", grad_segments=2)
            probe_head(model, encode_texts(model.tokenizer, [t["text"] for t in train], None),
                       [labels.index(t["label"]) for t in train])
            pred = predict_labels(model, encode_texts(model.tokenizer, [t["text"] for t in test], None)).argmax(1)
        elif name in RUNS:
            head, lr = RUNS[name]
            out = work / f"head-{name}"
            kept = (out / "heldout.json").is_file()
            if not kept:
                argv = ["classify", "train", args.lm, "--out", str(out), "--seed", "0", "--config", args.config,
                        "--data", str(data / "train.jsonl"), "--valid", str(data / "test.jsonl"), "-q",
                        "--steps", str(args.steps), "--lr", str(lr), "--head-init", head]
                print("$ txl " + " ".join(shlex.quote(a) for a in argv), flush=True)
                if txl_main(argv):
                    raise SystemExit(f"{name}: txl classify train failed")
            report = json.loads((out / "heldout.json").read_text())
            found = {**report["settings"], **report["settings"]["classifier"]}
            if (found["steps"], found["lr"], found["head_init"], found["seed"]) != (args.steps, lr, head, 0):
                raise SystemExit(f"{out} was trained with other settings; remove it or give another --work")
            pred = np.array([labels.index(p) for p in report["heldout_predictions"]])
        else:
            raise SystemExit(f"--rows: no row {name}; choose from probe-only, {', '.join(RUNS)}")
        if not kept:  # (a kept run is only scored)
            wall[name] = round(time.perf_counter() - start)
        rows[name] = scored(pred)
        a = rows[name]["accuracy"]
        print(f"{name}: accuracy {a['estimate']:.3f} [{a['low']:.3f}, {a['high']:.3f}]", flush=True)
    if args.json:
        results = {"test_documents": len(test), "classes": labels, "steps": args.steps, "seed": 0,
                   "config": args.config, "lm": args.lm, "rows": rows, "wall_s": wall,
                   "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
                   "date": time.strftime("%Y-%m-%d")}
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
