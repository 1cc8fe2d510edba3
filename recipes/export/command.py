"""``txl export``: a checkpoint's decoder as two graphs (ONNX or ``.pt2``) for deployment (docs/export.md)."""

from __future__ import annotations

import argparse

from txl.cli.checks import check_exists
from txl.cli.common import (add_checkpoint, add_checkpoint_name, add_option, add_span, add_threads, load_checkpoint,
                            print_notes)

NAME = "export"
HELP = "write a checkpoint's decoder as ONNX or torch.export graphs with a fixed-size ring state"
EXAMPLE = ("txl export runs/default runs/default-onnx --format onnx\n"
           "  txl export runs/default runs/default-onnx-int8 --quantize int8")
DETAILS = ("Writes OUT/segment.onnx (reads a prompt in segments), OUT/step.onnx (one token per row, its state the "
           "memory's keys and values in a ring of fixed size), vocab.json and export.json. Generate with them: "
           "python -m txl_recipes.export.runner OUT \"prompt\" -n 40 (greedy: the tokens of txl generate "
           "--temperature 0 with the same --mem-len).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``export`` flags (no torch import here)."""
    add_checkpoint(p)
    p.add_argument("out", metavar="OUT", help="folder to write (new or empty; never overwritten)")
    add_checkpoint_name(p)
    add_option(p, "--format", choices=("onnx", "pt2"), default="onnx",
               help="onnx (ONNX Runtime; needs the export extra) or pt2 (torch.export) (default onnx)")
    # its own dest: load_checkpoint's --quantize would make the model int8 in txl before the export
    add_option(p, "--quantize", choices=("int8",), default=None, dest="export_quantize",
               help="int8: the weight products of the ONNX graphs made dynamic int8 (ONNX Runtime's quantizer; "
                    "with --format onnx) (default: float32)")
    # a ring needs one memory slot at least
    add_span(p, ("tgt_len", "mem_len", "clamp_len", "same_length"), default_text="the model's", memory_needed=True)
    add_threads(p)
    p.set_defaults(device="cpu")  # graphs are traced on the CPU (ONNX Runtime picks its own device)


def run(args: argparse.Namespace) -> int:
    """Run ``txl export``."""
    check_exists(args.checkpoint, "checkpoint", kind="folder")  # before torch is imported
    from txl.fileio import check_output_folder

    check_output_folder(args.out, flag="OUT", empty=True, inputs=[args.checkpoint])  # before the model is loaded
    ckpt, _ = load_checkpoint(args, announce=True)
    from txl.config import VOCAB_NAME
    from txl_recipes.export.files import check_export, export_decoder
    from txl.config import resolve_span

    span = resolve_span(ckpt.model.config, tgt_len=args.tgt_len, mem_len=args.mem_len, clamp_len=args.clamp_len,
                        same_length=args.same_length)
    check_export(ckpt.model, span, args.format, ckpt.path / VOCAB_NAME, args.export_quantize)  # before the start line: one line if refused
    print_notes(args)
    manifest = export_decoder(ckpt.model, ckpt.path / VOCAB_NAME, args.out, span, args.format,
                              inputs=[args.checkpoint], quantize=args.export_quantize)
    s = manifest["span"]
    int8 = manifest.get("int8_products")
    weights = f", int8 products: {int8['step']} in the step, {int8['segment']} in the prompt reader" if int8 else ""
    print(f"wrote {args.out}: {', '.join(manifest['graphs'].values())} (tgt_len {s['tgt_len']}, mem_len {s['mem_len']}, "
          f"{manifest['capacity']} slots per layer{weights})")
    return 0
