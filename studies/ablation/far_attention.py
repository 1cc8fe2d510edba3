"""Where an ablation variant's attention goes beyond the distances it was trained on.

    python -m txl_studies.ablation.far_attention runs/ablate txl rope --data data/tinyshakespeare.txt

For each named variant of a `txl ablate` run folder: 512 characters from near the end of the text (the
valid split of the default 0.9/0.05/0.05 split) read in segments of 64 with a memory of 256 and
``same_length`` by the plain reference (:mod:`txl.model.reference`), then per layer the share of the
last segment's attention on keys 128 or more back (beyond the 127 a model trained with segments and
memory of 64 has seen), and the bits per character of targets 257-511 read with a memory of 128 and of 256.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a txl ablate --out folder")
    ap.add_argument("variants", nargs="+", help="variant names (e.g. txl rope)")
    ap.add_argument("--data", required=True, help="the text the ablation read")
    ap.add_argument("--offset", type=int, default=1_050_000, help="first character read (default 1,050,000)")
    args = ap.parse_args()
    import math

    import numpy as np
    import torch

    from txl.model import AttentionSpan, reference
    from txl.training.checkpoint import load_checkpoint

    torch.set_num_threads(1)
    text = Path(args.data).read_text(encoding="utf-8")[args.offset:args.offset + 4000]
    out = {}
    for name in args.variants:
        ckpt = load_checkpoint(Path(args.run) / name / "best")
        model = ckpt.model.eval()
        ids = torch.from_numpy(np.asarray(ckpt.tokenizer.encode(text)[:512], dtype=np.int64))[None]

        def read(mem: int):
            return reference.forward(model, ids, [64] * 8, span=AttentionSpan(tgt_len=64, mem_len=mem, same_length=True))

        far, shares = None, []
        ref = read(256)
        for probs in ref.probs[-1]:  # per layer [1, H, T, K] of the last segment
            far = (ref.distances[-1] >= 128).to(probs.dtype)
            shares.append(round(float((probs[0] * far).sum(-1).mean()), 3))

        def bpc(r) -> float:
            logp = torch.log_softmax(r.logits[0, :-1].double(), -1)
            targets = ids[0, 1:]
            return float(-logp[torch.arange(len(targets)), targets][256:].mean() / math.log(2))

        out[name] = {"share of attention on distances >= 128 at memory 256, per layer": shares,
                     "bpc, targets 257-511, memory 128": round(bpc(read(128)), 3),
                     "bpc, targets 257-511, memory 256": round(bpc(ref), 3)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
