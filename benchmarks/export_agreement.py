"""Greedy tokens of an int8 ONNX export against its float32 export and txl's eager decoding.

    txl export runs/docstrings/lm /tmp/exp-f --mem-len 512
    txl export runs/docstrings/lm /tmp/exp-q --mem-len 512 --quantize int8
    PYTHONPATH=src python benchmarks/export_agreement.py runs/docstrings/lm /tmp/exp-f /tmp/exp-q \\
        runs/docstrings/data/test.jsonl --json benchmarks/results/export-int8-agreement-docstrings.json

For the first ``--documents`` JSON Lines records (their ``prompt`` field), the first ``--prompt-tokens``
tokens are the prompt; each decoder continues it greedily for ``--tokens`` tokens. Prints and writes
how many continuations are identical and where each int8 one first differs from the float32 export.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> int:
    import numpy as np
    import torch

    from txl_recipes.export.runner import ExportedDecoder
    from txl.generation import generate
    from txl.training.checkpoint import load_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("float_export")
    ap.add_argument("int8_export")
    ap.add_argument("documents", help="JSON Lines with a 'prompt' field")
    ap.add_argument("--documents", dest="n", type=int, default=24)
    ap.add_argument("--prompt-tokens", type=int, default=400)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    ckpt = load_checkpoint(args.checkpoint)
    floats, int8 = ExportedDecoder(args.float_export), ExportedDecoder(args.int8_export)
    mem_len = floats.manifest["span"]["mem_len"]
    records = [json.loads(line) for line in Path(args.documents).read_text().splitlines()[:args.n]]
    first_difference, eager_equal = [], 0
    for record in records:
        ids = np.asarray(ckpt.tokenizer.encode(record["prompt"]), np.int64)[:args.prompt_tokens][None]
        a = floats.greedy(ids, args.tokens)[0, ids.shape[1]:]
        b = int8.greedy(ids, args.tokens)[0, ids.shape[1]:]
        eager = generate(ckpt.model, torch.as_tensor(ids), args.tokens, temperature=0, mem_len=mem_len)
        eager_equal += int(np.array_equal(a, eager[0, ids.shape[1]:].numpy()))
        differ = np.nonzero(a != b)[0]
        first_difference.append(int(differ[0]) if differ.size else None)
    result = {"checkpoint": args.checkpoint, "mem_len": mem_len, "prompts": len(records),
              "prompt_tokens": args.prompt_tokens, "tokens": args.tokens, "float_export_equals_eager": eager_equal,
              "int8_identical": sum(d is None for d in first_difference), "int8_first_difference": first_difference}
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
