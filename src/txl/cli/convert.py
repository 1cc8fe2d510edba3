"""``txl convert hf|to-hf|int8``: convert Hugging Face TransfoXL checkpoints to txl and back; write a checkpoint
with int8 weights."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_exists
from txl.cli.common import Command

NAME = "convert"
HELP = "convert Hugging Face TransfoXL checkpoints to txl and back, or a checkpoint to int8 weights"
EXAMPLE = "txl convert hf hf-models/transfo-xl-wt103 runs/wt103-hf"


def _add_from_hf(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC", help="HF TransfoXLLMHeadModel folder (config.json, weights, vocab.pkl)")
    p.add_argument("dst", metavar="DST", help="txl checkpoint folder to write (never overwritten)")
    p.add_argument("--vocab", help="vocabulary to use instead of SRC/txl_vocab.json (written by to-hf) or SRC/vocab.pkl "
                        "(txl vocab.json or HF vocab.pkl)")


def _from_checkpoint(dst_text: str, converter: str):
    """The ``(add_arguments, run)`` of a ``txl convert`` subcommand that reads ``CHECKPOINT`` and writes ``DST``
    (``to-hf``, ``int8``): ``dst_text`` is DST's help, ``converter`` the name of the
    :mod:`txl.convert.commands` function that writes it (imported, torch with it, once the checkpoint folder
    is found)."""

    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("src", metavar="CHECKPOINT",
                       help="txl checkpoint directory, or a run directory (uses its best/)")
        p.add_argument("dst", metavar="DST", help=dst_text)

    def run(args: argparse.Namespace) -> int:
        check_exists(args.src, "checkpoint", kind="folder")  # before torch is imported
        from txl.convert import commands

        print(f"wrote {getattr(commands, converter)(args.src, args.dst)}")
        return 0

    return add_arguments, run


def _from_hf(args: argparse.Namespace) -> int:
    """``txl convert hf SRC DST``."""
    check_exists(args.src, "SRC", kind="folder")  # before torch is imported
    check_exists(args.vocab, "--vocab", kind="file")
    from txl.convert.commands import convert_from_hf

    print(f"wrote {convert_from_hf(args.src, args.dst, vocab=args.vocab)}")
    return 0


SUBCOMMANDS = (
    Command("hf", "an HF TransfoXLLMHeadModel folder (config.json, weights, vocab.pkl) -> a txl checkpoint",
            "txl convert hf hf-models/transfo-xl-wt103 runs/wt103-hf", _add_from_hf, _from_hf),
    Command("to-hf", "a txl checkpoint -> an HF TransfoXLLMHeadModel folder",
            "txl convert to-hf runs/wt103 hf-models/my-transfo-xl",
            *_from_checkpoint("HF folder to write (never overwritten)", "convert_to_hf")),
    Command("int8", "a txl checkpoint -> the same with int8 weights, for inference (docs/quantization.md)",
            "txl convert int8 runs/default runs/default-int8",
            *_from_checkpoint("txl checkpoint folder to write (never overwritten)", "convert_to_int8")),
)
