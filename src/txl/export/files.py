"""``txl export``: write a model's decoder as two graphs (ONNX, or ``torch.export``'s ``.pt2``) with a manifest.

The folder holds ``segment.onnx`` and ``step.onnx`` (or ``.pt2``; ONNX weights beside them in
``*.onnx.data``), the checkpoint's ``vocab.json`` and ``export.json``: the format, the span, the ring's
shape and the graphs' input and output names, everything :mod:`txl.export.runner` needs. The graphs
are those of :mod:`txl.model.ring`; the batch size is dynamic, every other size fixed.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import warnings
from pathlib import Path

import torch

from txl.errors import TxlError
from txl.model.ring import RingStep, SegmentReader, check_exportable, ring_capacity
from txl.fileio import claim_folder, write_json
from txl.model.quantize import is_quantized
from txl.model.span import AttentionSpan

FORMATS = ("onnx", "pt2")
SEGMENT_INPUTS = ["input_ids", "mems", "mem_padding", "n_valid"]
SEGMENT_OUTPUTS = ["new_mems", "new_padding", "keys", "values", "fill"]
STEP_INPUTS = ["input_ids", "keys", "values", "write", "fill"]
STEP_OUTPUTS = ["logits", "key", "value"]
MANIFEST = "export.json"


def example_inputs(model, span: AttentionSpan, batch_size: int = 2) -> tuple[tuple, tuple]:
    """Inputs of the right shapes and dtypes for the two graphs (zeros; the step's ring half full)."""
    c = model.config
    dtype = model.word_emb.emb_layers[0].weight.dtype
    device = model.word_emb.emb_layers[0].weight.device
    capacity = ring_capacity(span)
    ring = torch.zeros(c.n_layer, batch_size, c.n_head, capacity, c.d_head, dtype=dtype, device=device)
    segment = (torch.zeros(batch_size, span.tgt_len, dtype=torch.long, device=device),
               torch.zeros(c.n_layer, batch_size, span.mem_len, c.d_model, dtype=dtype, device=device),
               torch.full((batch_size,), span.mem_len, dtype=torch.long, device=device),
               torch.tensor(min(2, span.tgt_len), device=device))
    step = (torch.zeros(batch_size, 1, dtype=torch.long, device=device), ring, ring.clone(),
            torch.tensor(capacity // 2, device=device), torch.tensor(capacity // 2, device=device))
    return segment, step


@contextlib.contextmanager
def _quiet():
    """The exporters' progress lines, warnings and log records kept off the user's terminal (a failure
    still raises, with its message)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def check_export(model, span: AttentionSpan, fmt: str, vocab: Path) -> None:
    """Everything :func:`export_decoder` refuses before it writes (the CLI calls it before its start line).

    Raises:
        TxlError: an unknown format, a model or span the graphs cannot hold
            (:func:`~txl.model.ring.check_exportable`), weights other than float32 (int8, half
            precision, float64: the runner's state is float32), a missing ``vocab``, a missing
            ``onnx``/``onnxscript`` for ONNX.
    """
    if fmt not in FORMATS:
        raise TxlError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    check_exportable(model.config, span)
    if is_quantized(model) or any(p.dtype != torch.float32 for p in model.parameters()):
        raise TxlError("export takes a float32 model: int8, half-precision and float64 weights are not exported "
                       "(use the float32 checkpoint)")
    if not Path(vocab).is_file():
        raise TxlError(f"{vocab} is missing: the exported decoder needs the checkpoint's vocabulary")
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError:
            raise TxlError("--format onnx needs onnx and onnxscript: in the txl folder, "
                           ".venv/bin/python -m pip install -e '.[export]'") from None


def export_decoder(model, vocab: Path, out: str | os.PathLike[str], span: AttentionSpan, fmt: str = "onnx",
                   inputs: tuple = ()) -> dict:
    """Export ``model``'s segment reader and one-token step into the new (or empty) folder ``out``.

    Args:
        model: a float32 :class:`~txl.model.TransformerXLLM` (put in eval mode here).
        vocab: the checkpoint's ``vocab.json`` (copied beside the graphs).
        span: the span to decode with (``tgt_len`` tokens per prompt segment, ``mem_len``, ``clamp_len``,
            ``same_length``), as ``txl generate`` would.
        fmt: "onnx" (``torch.onnx.export``, dynamo; needs ``onnx`` and ``onnxscript``: the ``export``
            extra) or "pt2" (``torch.export.save``).
        inputs: files or folders the command reads (``out`` may not be one of them or lie inside one).

    Returns:
        The manifest written to ``out/export.json``.

    Raises:
        TxlError: what :func:`check_export` refuses; ``out`` that is not new or empty; a failed export
            (nothing is left in ``out`` then).
    """
    check_export(model, span, fmt, vocab)
    model.eval()
    c = model.config
    segment_args, step_args = example_inputs(model, span)
    graphs = {"segment": SegmentReader(model, span).eval(), "step": RingStep(model, span).eval()}
    args = {"segment": segment_args, "step": step_args}
    batch = torch.export.Dim("batch", min=1, max=65536)
    dynamic = {"segment": ({0: batch}, {1: batch}, {0: batch}, None),
               "step": ({0: batch}, {1: batch}, {1: batch}, None, None)}
    names = {"segment": (SEGMENT_INPUTS, SEGMENT_OUTPUTS), "step": (STEP_INPUTS, STEP_OUTPUTS)}
    manifest = {
        "format": fmt, "graphs": {k: f"{k}.{fmt}" for k in graphs}, "vocab": "vocab.json",
        "span": span.to_dict(), "capacity": ring_capacity(span), "n_layer": c.n_layer, "n_head": c.n_head,
        "d_head": c.d_head, "d_model": c.d_model, "vocab_size": c.vocab_size,
        "dtype": str(model.word_emb.emb_layers[0].weight.dtype).removeprefix("torch."),
        "logits": "log_probs" if c.cutoffs else "scores",
        "inputs": {k: v[0] for k, v in names.items()}, "outputs": {k: v[1] for k, v in names.items()},
    }
    folder = Path(out)
    with claim_folder(folder, flag="OUT", empty=True, inputs=list(inputs)):
        try:
            with torch.no_grad(), _quiet():
                for key, module in graphs.items():
                    path = folder / manifest["graphs"][key]
                    if fmt == "pt2":
                        program = torch.export.export(module, args[key], dynamic_shapes=dynamic[key])
                        torch.export.save(program, str(path))
                    else:
                        torch.onnx.export(module, args[key], str(path), dynamo=True, dynamic_shapes=dynamic[key],
                                          input_names=names[key][0], output_names=names[key][1],
                                          external_data=True, verbose=False, optimize=True)
            shutil.copyfile(vocab, folder / "vocab.json")
            write_json(folder / MANIFEST, manifest)  # last: a folder with export.json is complete
        except BaseException as err:
            for child in folder.iterdir():  # the folder was new or empty: leave it so
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            if isinstance(err, (TxlError, KeyboardInterrupt)):
                raise
            raise TxlError(f"export failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                           "nothing was written") from err
    return manifest
