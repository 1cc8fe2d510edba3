"""How strong the linear probe's L2 penalty should be: the probe alone, on both classification benchmarks.

The classifier's head starts from a linear probe over the training documents' pooled vectors
(:mod:`txl_recipes.classify.probe`, ``C = 1``). On the package benchmark that probe fits the training
documents almost perfectly and fine-tuning then gets little gradient; a stronger penalty (a smaller C)
would leave it more. This measures what a stronger penalty costs the probe itself: for each C, the
probe's accuracy and mean cross-entropy (nats) on the training documents and on the test documents
(with a 95% bootstrap interval over the test documents), with no fine-tuning, in the default reading (every segment pooled, ``--pooling document``) of the
benchmark's config.

    OMP_NUM_THREADS=2 python -m txl_studies.classification.probe \\
        --bench long:runs/lm-main:runs/longdocs:studies/classification/classify-long.toml \\
        --bench packages:runs/docstrings/lm:runs/packages:studies/classification/classify-packages.toml \\
        --json benchmarks/results/classification-probe-penalty.json

``--bench NAME:LM:WORK:CONFIG``: the language model, the folder of ``txl_studies.classification.run``'s data
(``WORK/data``) and the config whose ``tgt_len``/``mem_len`` read the documents. The pooled vectors are
kept in ``WORK/probe-vectors.pt`` (a tensor file of this script's own) and reused.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import tomllib
from pathlib import Path


PENALTIES = (10.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003)


def vectors(lm: str, work: Path, config: Path) -> dict:
    """The pooled vectors (float64 [N, d_model]) and labels of the train and test documents, read once."""
    import torch

    from txl.classification import TransformerXLForSequenceClassification
    from txl.classification.data import encode_texts
    from txl_recipes.classify.probe import pooled_vectors

    kept = work / "probe-vectors.pt"
    if kept.is_file():
        return torch.load(kept, weights_only=True)
    reading = tomllib.loads(config.read_text())["classify"]
    train, test = ([json.loads(line) for line in (work / "data" / f"{split}.jsonl").read_text().splitlines()]
                   for split in ("train", "test"))
    labels = sorted({t["label"] for t in train})
    model = TransformerXLForSequenceClassification.from_pretrained_lm(
        lm, len(labels), labels=labels, mode="memory", pooling="document", grad_segments=2,
        tgt_len=reading["tgt_len"], mem_len=reading["mem_len"])
    start = time.perf_counter()
    out = {"train": pooled_vectors(model, encode_texts(model.tokenizer, [t["text"] for t in train], None)),
           "test": pooled_vectors(model, encode_texts(model.tokenizer, [t["text"] for t in test], None)),
           "train_labels": torch.tensor([labels.index(t["label"]) for t in train]),
           "test_labels": torch.tensor([labels.index(t["label"]) for t in test]),
           "read_s": torch.tensor(time.perf_counter() - start)}
    torch.save(out, kept)
    return out


def sweep(found: dict) -> list[dict]:
    """For each C: the probe's accuracy and cross-entropy on the train and test documents."""
    import torch.nn.functional as F

    from txl_recipes.classify.probe import fit_probe
    from txl.evaluation.intervals import accuracy, bootstrap_interval

    rows = []
    classes = int(found["train_labels"].max()) + 1
    for c in PENALTIES:
        shift, scale, weight, bias = fit_probe(found["train"], found["train_labels"].tolist(), classes, c=c)
        row = {"C": c, "weight_norm": float(weight.norm())}
        for split in ("train", "test"):
            logits = ((found[split] - shift) * scale) @ weight.T + bias
            y = found[f"{split}_labels"]
            row[f"{split}_accuracy"] = float((logits.argmax(1) == y).double().mean())
            row[f"{split}_loss"] = float(F.cross_entropy(logits, y))
        y, predicted = found["test_labels"].numpy(), logits.argmax(1).numpy()
        interval = bootstrap_interval((y, predicted), lambda t, q: accuracy(t, q), n=2000, seed=0)
        row["test_accuracy_interval"] = [interval.low, interval.high]
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", action="append", required=True, metavar="NAME:LM:WORK:CONFIG")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = {}
    for bench in args.bench:
        name, lm, work, config = bench.split(":")
        found = vectors(lm, Path(work), Path(config))
        results[name] = {"lm": lm, "config": config, "train_documents": len(found["train_labels"]),
                         "test_documents": len(found["test_labels"]), "rows": sweep(found)}
        print(f"{name}: {len(found['train_labels'])} train / {len(found['test_labels'])} test documents")
        for row in results[name]["rows"]:
            low, high = row["test_accuracy_interval"]
            print(f"  C={row['C']:<6} train {row['train_accuracy']:.3f} ({row['train_loss']:.3f} nats)"
                  f"  test {row['test_accuracy']:.3f} [{low:.3f}, {high:.3f}] ({row['test_loss']:.3f} nats)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "what": "the linear probe alone (no fine-tuning) for each L2 penalty C, in the default reading",
            "command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "date": time.strftime("%Y-%m-%d"),
            "benchmarks": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
