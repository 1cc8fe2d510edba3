"""Accuracy of each classification row by test-document length, from txl_studies.classification.run's JSON.

    python -m txl_studies.classification.by_length benchmarks/results/classification-packages.json \\
        --lm runs/docstrings/lm --data runs/packages/data

Counts each test document's tokens with the language model's tokenizer, splits the documents at
``--edges`` (tokens), and prints per bucket the accuracy of every row whose predictions the JSON keeps,
with the paired 95% bootstrap interval of memory minus window per seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path



def main() -> int:
    import numpy as np

    from txl.data import load_tokenizer
    from txl.evaluation.intervals import accuracy, bootstrap_interval

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="the JSON txl_studies.classification.run wrote")
    ap.add_argument("--lm", required=True, help="the language-model run the classifiers were fine-tuned from")
    ap.add_argument("--data", required=True, help="the txl data packages folder (its test.jsonl)")
    ap.add_argument("--edges", default="640,768", help="bucket edges in tokens")
    args = ap.parse_args()
    vocab = Path(args.lm) / "best" / "vocab.json"
    for path, what in ((Path(args.results), "results JSON"), (Path(args.data) / "test.jsonl", "--data test.jsonl"),
                       (vocab, "--lm vocabulary (LM/best/vocab.json)")):
        if not path.is_file():
            raise SystemExit(f"{what}: {path} is not a file")
    results = json.loads(Path(args.results).read_text())
    labels = results["classes"]
    test = [json.loads(line) for line in (Path(args.data) / "test.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(str(vocab))
    tokens = np.array([len(tokenizer.encode(t["text"])) for t in test])
    y = np.array([labels.index(t["label"]) for t in test])
    preds = {k: np.array([labels.index(p) for p in r["predictions"]])
             for k, r in results["rows"].items() if "predictions" in r}
    edges = [0, *(int(e) for e in args.edges.split(",")), int(tokens.max()) + 1]
    out = {"tokens": {"median": float(np.median(tokens)), "p10": float(np.percentile(tokens, 10)),
                      "p90": float(np.percentile(tokens, 90)), "max": int(tokens.max())}, "buckets": {}}
    for lo, hi in zip(edges, edges[1:]):
        sel = (tokens >= lo) & (tokens < hi)
        row = {"documents": int(sel.sum())}
        row.update({k: round(float((p[sel] == y[sel]).mean()), 3) for k, p in sorted(preds.items())})
        for seed in range(3):
            a, b = preds.get(f"memory/seed{seed}"), preds.get(f"window/seed{seed}")
            if a is not None and b is not None:
                iv = bootstrap_interval((y[sel], a[sel], b[sel]), lambda t, u, v: accuracy(t, u) - accuracy(t, v),
                                        n=2000, seed=0)
                row[f"memory_minus_window/seed{seed}"] = [round(iv.estimate, 3), round(iv.low, 3), round(iv.high, 3)]
        out["buckets"][f"{lo}-{hi - 1} tokens"] = row
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
