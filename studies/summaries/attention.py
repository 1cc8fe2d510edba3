"""Where does a fine-tuned summariser look when it starts a summary? Attention on the name at the separator.

For each test pair (``prompt``: the document, ``name``: the function or class), reads the document
and the separator with the memory, segment by segment (one document at a time, the checkpoint's
[eval] span unless --tgt-len/--mem-len), and at the separator's query (the one that predicts the
summary's first token) takes each layer's attention mass on the tokens of the name in the ``def`` /
``class`` line, in the head that puts the most there; zero when the name is out of the layer's keys.
Reports it per layer, by the name's distance from the separator (in tokens), next to what uniform
attention over the keys would give, so a reader can see whether the model reads the name from afar.

    python -m txl_studies.summaries.attention runs/docstrings/ft-seed0 runs/docstrings/data/test.jsonl \\
        --json benchmarks/results/summaries-attention.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch


BUCKETS = ((0, 128), (128, 512), (512, 1024), (1024, 1 << 30))


def name_positions(tokenizer, prompt: str, name: str) -> np.ndarray:
    """Token positions of the prompt that cover the name's last part in its ``def`` / ``class`` line
    (not a decorator's), found by encoding the text before and up to it; empty when not found."""
    short = name.split(".")[-1]
    found = re.search(rf"\b(?:def|class)\s+({re.escape(short)})\b", prompt)
    if found is None:
        return np.zeros(0, dtype=np.int64)
    start = found.start(1)
    first = len(tokenizer.encode(prompt[:start]))
    last = len(tokenizer.encode(prompt[:start + len(short)]))
    return np.arange(max(0, first - 1), max(first, last))  # the boundary token may hold the name's first bytes


@torch.no_grad()
def name_shares(model, tokenizer, sep_id: int, pairs: list[dict], span) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair: the distance of the name from the separator (tokens), the share per layer (float64
    [n, n_layer]) and what uniform attention over the separator's keys would give (float64 [n])."""
    from txl.analysis.attention_maps import segment_probabilities
    from txl.kernels.cpu import check_reading_fits
    from txl.segments import eval_mode, segments

    n_layer = len(model.layers)
    distances, shares, uniform = [], np.zeros((len(pairs), n_layer)), np.zeros(len(pairs))
    for i, pair in enumerate(pairs):
        ids = np.concatenate([np.asarray(tokenizer.encode(pair["prompt"]), dtype=np.int64), [sep_id]])
        where = name_positions(tokenizer, pair["prompt"], pair["name"])
        query = ids.size - 1
        distances.append(int(query - where.mean()) if where.size else -1)
        check_reading_fits(model, torch.as_tensor(ids)[None], span)
        with eval_mode(model):
            for seg in segments(model, torch.as_tensor(ids)[None], span=span):
                probs = segment_probabilities(model, seg.inputs, seg.mems, span)
                t, klen = seg.inputs.size(1), probs[0].size(-1)
                if not seg.start <= query < seg.start + t:
                    continue
                first_key = seg.start - (klen - t)
                keys = where - first_key
                keys = keys[(keys >= 0) & (keys < klen)]
                visible = query - first_key + 1  # the keys the separator may attend to (causal)
                uniform[i] = keys.size / visible
                for layer, p in enumerate(probs):
                    shares[i, layer] = float(p[0, :, query - seg.start, keys].sum(-1).max()) if keys.size else 0.0
    return np.asarray(distances), shares, uniform


def main() -> int:
    from txl.data.pairs import find_markers
    from txl.config import AttentionSpan
    from txl.training.checkpoint import load_checkpoint

    ap = argparse.ArgumentParser(prog="python -m txl_studies.summaries.attention", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("pairs", help="a .jsonl of {prompt, completion, name}")
    ap.add_argument("--tgt-len", type=int)
    ap.add_argument("--mem-len", type=int)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.checkpoint)
    model, tokenizer = ckpt.model.eval(), ckpt.tokenizer
    run_eval = ckpt.run.eval
    span = AttentionSpan(tgt_len=args.tgt_len or run_eval.tgt_len or model.config.tgt_len,
                         mem_len=args.mem_len if args.mem_len is not None else run_eval.mem_len)
    pairs = [json.loads(line) for line in Path(args.pairs).read_text().splitlines() if line.strip()]
    distances, shares, uniform = name_shares(model, tokenizer, find_markers(tokenizer).sep_id, pairs, span)
    rows = []
    for lo, hi in BUCKETS:
        sel = (distances >= lo) & (distances < hi)
        if sel.any():
            rows.append({"distance": [lo, hi], "documents": int(sel.sum()),
                         "share_per_layer": [round(float(v), 4) for v in shares[sel].mean(0)],
                         "uniform": round(float(uniform[sel].mean()), 4)})
    result = {"checkpoint": args.checkpoint, "span": {"tgt_len": span.tgt_len, "mem_len": span.mem_len},
              "documents": len(pairs), "by_distance": rows,
              "share_per_layer": [round(float(v), 4) for v in shares.mean(0)]}
    print(f"attention on the name at the separator (max over heads), per layer; tgt_len {span.tgt_len}, "
          f"mem_len {span.mem_len}")
    print("| name's distance (tokens) | documents | " + " | ".join(f"layer {i + 1}" for i in range(shares.shape[1]))
          + " | uniform |")
    print("|---|---|" + "---|" * (shares.shape[1] + 1))
    for r in rows:
        lo, hi = r["distance"]
        label = f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
        print(f"| {label} | {r['documents']} | " + " | ".join(f"{v:.3f}" for v in r["share_per_layer"])
              + f" | {r['uniform']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
