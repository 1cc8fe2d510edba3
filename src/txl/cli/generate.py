"""``txl generate``: sample text from a checkpoint, reusing the memory (one forward per new token).

Without ``--prompt`` or ``--prompt-file`` the prompt is a single newline: the sample starts at the
beginning of a line, conditioned on nothing else (unconditional sampling).
"""

from __future__ import annotations

import argparse
import itertools
import sys

from txl.cli.checks import check_decoding_flags, check_exists, check_line_keys, check_range
from txl.cli.common import (add_batch_size, add_checkpoint, add_checkpoint_name, add_decoding_flags, add_device,
                            add_dtype, add_quantize, add_seed, add_span, decoding_rules, end_ids, load_checkpoint,
                            print_notes)
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
    add_decoding_flags(p, max_new_tokens=300, max_new_help="tokens to sample", temperature=0.8,
                       stop_help="stop after this text, which is not printed (repeatable: stop at the first of them)",
                       beam_help="beam search with N beams, the memory reordered per beam (default 1: no beam "
                                 "search); prints the best continuation at the end", ranked="hypotheses")
    p.add_argument("--input", metavar="PROMPTS.jsonl", default=None,
                   help="decode every {\"prompt\": ...} line of this file, --batch-size at a time (prompts of "
                        "different lengths decoded together, each exactly as alone); JSON Lines out")
    add_batch_size(p, default=8, text="prompts of --input decoded together")
    add_seed(p)
    add_span(p, ("mem_len",), default_text="the model's")
    p.add_argument("--compile", action="store_true",
                   help="decode through torch.compile: the ring step of docs/export.md, one graph for every memory "
                        "fill, float32 or --quantize int8 (the first tokens pay the compilation; docs/compile.md)")
    add_dtype(p)
    add_quantize(p)
    add_device(p)


def _prompt(args: argparse.Namespace, tokenizer) -> str:
    """The prompt text from ``--prompt`` or ``--prompt-file`` (default a newline)."""
    if args.prompt_file:
        from txl.data.tokenizers import decode_file_text
        from txl.fileio import read_bytes

        # byte: any bytes (undecodable ones travel as surrogate escapes); char, word, BPE: UTF-8 text
        prompt = decode_file_text(read_bytes(args.prompt_file, "prompt file "), tokenizer.kind,
                                  f"prompt file {args.prompt_file}")
    else:
        prompt = args.prompt if args.prompt is not None else "\n"
    if prompt == "":
        where = f"prompt file {args.prompt_file} is empty" if args.prompt_file else "the prompt is empty"
        raise TxlError(f"{where}; give at least one character (or leave the prompt out: a newline)")
    return prompt


def run(args: argparse.Namespace) -> int:
    """Run ``txl generate``: print the prompt, then the sample as it is drawn."""
    check_decoding_flags(args)  # torch-free: checked before torch loads
    if args.prompt is not None and args.prompt_file:
        raise TxlError("give either --prompt or --prompt-file, not both")
    check_range(args, 0, "mem_len")
    check_range(args, 1, "num_beams", "batch_size")
    if args.input is not None and (args.prompt is not None or args.prompt_file):
        raise TxlError("give prompts either with --input or with --prompt/--prompt-file, not both")
    if args.compile:
        for flag, on in (("--input", args.input is not None), ("--num-beams", args.num_beams > 1),
                         ("a half-precision --dtype", args.dtype not in (None, "float32")),
                         ("--quantize bf16", args.quantize == "bf16")):
            if on:
                raise TxlError(f"--compile does not take {flag} yet; drop one of them")
    check_exists(args.checkpoint, "checkpoint", kind="folder")
    check_exists(args.prompt_file, "prompt file", kind="file")
    check_exists(args.input, "prompts file", kind="file")
    from txl.generation import StopText

    cut = StopText(args.stop)
    if args.input is not None:
        return _run_input(args)

    import numpy as np
    import torch

    from txl.generation import generate_steps, stream_text
    from txl.runtime import autocast

    ckpt, device = load_checkpoint(args, announce=True)
    prompt = _prompt(args, ckpt.tokenizer)
    prompt_ids = np.asarray(ckpt.tokenizer.encode(prompt), dtype=np.int64)
    ids = torch.as_tensor(prompt_ids, device=device)[None]
    if ids.size(1) == 0:
        raise TxlError("the prompt encodes to no tokens; give a longer prompt")
    if args.compile:  # what the ring step cannot hold, refused before the start line
        from txl.model.graphs import check_exportable
        from txl.config import resolve_span

        check_exportable(ckpt.model.config, resolve_span(ckpt.model.config, mem_len=args.mem_len), "--compile",
                         reader=False)
    print_notes(args)  # which checkpoint (the input has passed its checks)
    if args.compile and args.max_new_tokens > 0:  # (no token: nothing to compile)
        print("txl: compiling the decoder (torch.compile): the first tokens wait for it, a minute or so on a CPU",
              file=sys.stderr, flush=True)
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed if args.seed is not None else torch.seed() % (2**63))
    if args.num_beams > 1:  # the best continuation is known only at the end
        from txl.generation import continue_texts

        with autocast(device, args.dtype):
            text = continue_texts(ckpt.model, ckpt.tokenizer, [ids[0]], max_new_tokens=args.max_new_tokens,
                                  rules=decoding_rules(args), stop=args.stop, num_beams=args.num_beams,
                                  length_penalty=args.length_penalty, mem_len=args.mem_len,
                                  end_ids=end_ids(ckpt))[0]
        sys.stdout.write(ckpt.tokenizer.decode(prompt_ids.tolist()) + text + "\n")  # as read, as when streamed
        return 0
    with autocast(device, args.dtype):
        end = end_ids(ckpt)
        steps = generate_steps(ckpt.model, ids, args.max_new_tokens, generator=generator, mem_len=args.mem_len,
                               rules=decoding_rules(args), end_ids=end, compile=args.compile)
        tokens = itertools.takewhile(lambda token: token not in end, (_read(step) for step in steps))
        pieces = stream_text(ckpt.tokenizer, tokens, prompt_ids.tolist())
        # the prompt as the model reads it, so that all printed is decode(prompt + sample): a word model's
        # prompt ends with the <eos> its encoding adds (a line end), and unknown words read <unk>
        text = next(pieces)
        sys.stdout.write(text)
        sys.stdout.flush()
        try:
            for n, text in enumerate(pieces, 1):  # printed as drawn; all of it equals decode(prompt + sample)
                cut.armed = n >= args.min_new_tokens  # the last piece (what the decoder held back) counts as armed
                text = cut.push(text)
                if text:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                if cut.stopped:
                    break
        except KeyboardInterrupt:  # the sample's line ends, so that `txl: interrupted` starts a line of its own
            sys.stdout.write("\n")
            sys.stdout.flush()
            raise
        sys.stdout.write(cut.finish())
    sys.stdout.write("\n")
    return 0


def _run_input(args: argparse.Namespace) -> int:
    """``txl generate --input PROMPTS.jsonl``: one JSON line ``{"prompt", "text"}`` per prompt on stdout;
    prompt i samples with its own generator (seed + i), so the output does not depend on --batch-size."""
    import json

    from txl.fileio import read_jsonl

    prompts, lines = [], []
    for number, obj in read_jsonl(args.input, "prompts file"):
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise TxlError(f'{args.input} line {number} must be a JSON object with a non-empty "prompt" string')
        check_line_keys(obj, ("prompt",), f"{args.input} line {number}",
                        " (the decoding settings are flags, the same for every prompt: -n/--max-new-tokens, ...)")
        prompts.append(obj["prompt"])
        lines.append(number)
    if not prompts:
        raise TxlError(f"{args.input} holds no prompts")
    import torch  # once the prompts are read

    from txl.generation import continue_texts
    from txl.runtime import autocast

    ckpt, device = load_checkpoint(args, announce=True)
    ids = []
    for number, prompt in zip(lines, prompts):
        try:
            encoded = torch.as_tensor(ckpt.tokenizer.encode(prompt), dtype=torch.long, device=device)
        except TxlError as err:  # e.g. characters the vocabulary lacks: said with the line
            raise TxlError(f"{args.input} line {number}: {err}") from None
        if encoded.numel() == 0:
            raise TxlError(f"{args.input} line {number}: the prompt encodes to no tokens")
        ids.append(encoded)
    print_notes(args)
    seed = args.seed if args.seed is not None else torch.seed() % (2**62)
    generators = [torch.Generator(device=device).manual_seed(seed + i) for i in range(len(prompts))]
    with autocast(device, args.dtype):
        texts = continue_texts(ckpt.model, ckpt.tokenizer, ids, max_new_tokens=args.max_new_tokens,
                               rules=decoding_rules(args), generator=generators, stop=args.stop,
                               num_beams=args.num_beams, length_penalty=args.length_penalty,
                               batch_size=args.batch_size, mem_len=args.mem_len, end_ids=end_ids(ckpt))
    for prompt, text in zip(prompts, texts):
        print(json.dumps({"prompt": prompt, "text": text}, ensure_ascii=False))
    return 0


def _read(step) -> int:
    """The token of a batch-1 generation step, its device-side faults checked with it (one read)."""
    token = int(step.token[0])
    step.check()
    return token
