"""``txl generate``: sample text from a checkpoint, reusing the memory (one forward per new token).

Without ``--prompt`` or ``--prompt-file`` the prompt is a single newline: the sample starts at the
beginning of a line, conditioned on nothing else (unconditional sampling).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from txl.cli.common import (add_checkpoint, add_checkpoint_name, add_device, add_dtype, add_option, add_seed,
                            add_span, check_range, check_seed, load_checkpoint, print_notes, underscore)
from txl.errors import TxlError

NAME = "generate"
HELP = "sample text from a checkpoint, reusing the memory"
EXAMPLE = "txl generate runs/enwik8 --prompt 'The ' -n 500 --temperature 0.8 --seed 1"
DETAILS = ("Prints the prompt, then the sample as it is drawn, to stdout. Without --prompt or --prompt-file the "
           "prompt is a single newline: the sample starts at the beginning of a line, conditioned on nothing "
           "else (unconditional sampling; for a word-level model the newline is an <eos>).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``generate`` flags (no torch import here)."""
    add_checkpoint(p)
    add_checkpoint_name(p)
    p.add_argument("--prompt", "-p", default=None,
                   help="prompt text (default: a newline, so the sample starts a new line, as unconditional "
                        "sampling)")
    p.add_argument("--prompt-file", default=None, metavar="FILE", help="read the prompt from this file")
    add_option(p, "-n", "--max-new-tokens", aliases=underscore("--max-new-tokens"), type=int, default=300,
               metavar="N", help="tokens to sample (default 300)")
    p.add_argument("--temperature", "-t", type=float, default=0.8, help="0 = greedy (default 0.8)")
    add_option(p, "--top-k", aliases=underscore("--top-k"), type=int, default=None, metavar="K",
               help="sample among the K most likely tokens")
    add_option(p, "--top-p", aliases=underscore("--top-p"), type=float, default=None, metavar="P",
               help="nucleus sampling: among the most likely tokens holding probability P")
    add_seed(p)
    add_span(p, ("mem_len",), default_text="the model's")
    add_dtype(p)
    add_device(p)


def _prompt(args: argparse.Namespace, tokenizer) -> str:
    """The prompt text from ``--prompt`` or ``--prompt-file`` (default a newline)."""
    if args.prompt_file:
        try:
            raw = Path(args.prompt_file).read_bytes()
        except OSError as err:
            raise TxlError(f"cannot read prompt file {args.prompt_file}: {err.strerror or err}") from None
        if tokenizer.kind == "byte":  # any bytes: undecodable ones travel as surrogate escapes
            prompt = raw.decode("utf-8", errors="surrogateescape")
        else:
            from txl.data.tokenizers import decode_utf8

            prompt = decode_utf8(raw, source=f"prompt file {args.prompt_file}", kind=tokenizer.kind)
    else:
        prompt = args.prompt if args.prompt is not None else "\n"
    if prompt == "":
        raise TxlError("the prompt is empty; give at least one character with --prompt")
    return prompt


def run(args: argparse.Namespace) -> int:
    """Run ``txl generate``: print the prompt, then the sample as it is drawn."""
    from txl.generation import check_sampling

    check_sampling(args.temperature, args.top_k, args.top_p)
    check_seed(args.seed)
    if args.prompt is not None and args.prompt_file:
        raise TxlError("give either --prompt or --prompt-file, not both")
    check_range(args, 0, "max_new_tokens", "mem_len")

    import numpy as np
    import torch

    from txl.generation import generate_stream, stream_text
    from txl.runtime import autocast

    ckpt, device = load_checkpoint(args, announce=True)
    prompt = _prompt(args, ckpt.tokenizer)
    prompt_ids = np.asarray(ckpt.tokenizer.encode(prompt), dtype=np.int64)
    ids = torch.as_tensor(prompt_ids, device=device)[None]
    if ids.size(1) == 0:
        raise TxlError("the prompt encodes to no tokens; give a longer prompt")
    print_notes(args)  # which checkpoint (the input has passed its checks)
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed if args.seed is not None else torch.seed() % (2**63))
    with autocast(device, args.dtype):
        tokens = (int(t[0]) for t in generate_stream(ckpt.model, ids, args.max_new_tokens,
                                                     temperature=args.temperature, top_k=args.top_k,
                                                     top_p=args.top_p, generator=generator, mem_len=args.mem_len))
        pieces = stream_text(ckpt.tokenizer, tokens, prompt_ids.tolist())
        text = next(pieces)  # the prompt as the model reads it; words: as typed (decoding shows <unk>)
        sys.stdout.write(prompt if ckpt.tokenizer.kind == "word" else text)
        sys.stdout.flush()
        for text in pieces:  # printed as drawn; all of it equals decode(prompt + sample)
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
