"""``txl export``: write a model's decoder as two graphs (ONNX, or ``torch.export``'s ``.pt2``) with a manifest.

The folder holds ``segment.onnx`` and ``step.onnx`` (or ``.pt2``; ONNX weights beside them in
``*.onnx.data``), the checkpoint's ``vocab.json`` and ``export.json``: the format, the span, the ring's
shape and the graphs' input and output names, everything :mod:`txl_recipes.export.runner` needs. The graphs
are those of :mod:`txl.model.graphs`; the batch size is dynamic, every other size fixed.
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
from txl.model.graphs import RingStep, check_exportable, ring_capacity
from txl.fileio import claim_folder, write_json
from txl.kernels.int8 import is_quantized
from txl.config import AttentionSpan, check_choice
from txl_recipes.export.reader import SegmentReader

FORMATS = ("onnx", "pt2")
QUANTIZE = ("int8",)
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
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "")]  # ONNX Runtime's quantizer logs to the root
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def check_export(model, span: AttentionSpan, fmt: str, vocab: Path, quantize: str | None = None) -> None:
    """Everything :func:`export_decoder` refuses before it writes (the CLI calls it before its start line).

    Raises:
        TxlError: an unknown format, a model or span the graphs cannot hold
            (:func:`~txl.model.graphs.check_exportable`), weights other than float32 (int8, half
            precision, float64: the runner's state is float32), a missing ``vocab``, a missing
            ``onnx``/``onnxscript`` for ONNX; ``quantize`` other than "int8", or with a format other than
            ONNX, or without ``onnxruntime``.
    """
    check_choice(fmt, FORMATS, "--format")
    check_choice(quantize, (*QUANTIZE, None), "--quantize")
    if quantize and fmt != "onnx":
        raise TxlError(f"--quantize {quantize} is for --format onnx (ONNX Runtime's int8 products); a .pt2 holds "
                       "float32 weights")
    check_exportable(model.config, span)
    if is_quantized(model) or any(p.dtype != torch.float32 for p in model.parameters()):
        raise TxlError("export takes a float32 model: int8, half-precision and float64 weights are not exported "
                       "(use the float32 checkpoint; --quantize int8 makes the exported products int8)")
    if not Path(vocab).is_file():
        raise TxlError(f"{vocab} is missing: the exported decoder needs the checkpoint's vocabulary")
    if fmt == "onnx":
        need = ["onnx", "onnxscript"] + (["onnxruntime"] if quantize else [])
        for package in need:
            try:
                __import__(package)
            except ImportError:
                raise TxlError(f"--format onnx{' --quantize ' + quantize if quantize else ''} needs "
                               f"{' and '.join(need)}: in the txl folder, .venv/bin/python -m pip install -e "
                               "'.[export]'") from None


def _linear_as_matmul(graph) -> None:
    """Rewrite each ``Gemm`` of the ONNX ``graph`` whose weight is an initializer (``x @ W^T + b``, as
    ``nn.Linear`` exports) as ``MatMul`` with the transposed weight (+ ``Add``), in place: ONNX Runtime's
    dynamic quantizer mishandles a transposed Gemm weight, and quantizes MatMul weights per column."""
    import numpy as np
    from onnx import helper, numpy_helper

    weights = {t.name: t for t in graph.initializer}
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("transA", 0) == 0 and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
        if node.op_type != "Gemm" or node.input[1] not in weights or not plain:
            nodes.append(node)
            continue
        name = node.input[1]
        if attrs.get("transB", 0):
            name += ".T"  # a tied weight (the embedding's Gather reads it too) keeps its own copy
            if name not in weights:
                weight = numpy_helper.to_array(weights[node.input[1]])
                weights[name] = numpy_helper.from_array(np.ascontiguousarray(weight.T), name)
                graph.initializer.append(weights[name])
        if len(node.input) > 2 and node.input[2]:
            product = node.output[0] + "_product"
            nodes += [helper.make_node("MatMul", [node.input[0], name], [product], name=node.name + "_matmul"),
                      helper.make_node("Add", [product, node.input[2]], list(node.output), name=node.name + "_bias")]
        else:
            nodes.append(helper.make_node("MatMul", [node.input[0], name], list(node.output), name=node.name))
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # the exporter's intermediate shapes; the quantizer infers them again


def quantize_onnx_graph(path: Path) -> int:
    """Replace the ONNX graph at ``path`` (and its ``.data``) by its dynamic int8 form: every product with a
    2-D weight becomes ONNX Runtime's ``DynamicQuantizeMatMul`` (7-bit weights in int8, one scale per output
    column; the activations quantised to uint8 per call), the embedding lookup and everything else stay
    float32. Weights use 7 bits (``reduce_range``) because x86 CPUs without VNNI multiply uint8 by int8 in
    pairs summed into int16, which saturates with full-range weights: the logits would depend on the CPU.

    Returns the number of products made int8. Raises what ONNX Runtime's quantizer raises.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(path))  # the weights too, from path's .data
    _linear_as_matmul(model.graph)
    weights = {t.name: len(t.dims) for t in model.graph.initializer}
    products = [n.name for n in model.graph.node if n.op_type == "MatMul" and weights.get(n.input[1]) == 2]
    for stale in (path, path.with_name(path.name + ".data")):
        stale.unlink(missing_ok=True)
    quantize_dynamic(model, str(path), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                     op_types_to_quantize=["MatMul"], nodes_to_quantize=products, use_external_data_format=True)
    return len(products)


def _readable_as_made(folder: Path) -> None:
    """Give every file of ``folder`` the permissions of a file this process creates (0666 less the umask):
    the exporters write the weights' ``.onnx.data`` files readable by their owner only, which a deployment
    running as another user could not read beside the readable graphs."""
    mask = os.umask(0)
    os.umask(mask)
    for path in folder.iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


def export_decoder(model, vocab: Path, out: str | os.PathLike[str], span: AttentionSpan, fmt: str = "onnx",
                   inputs: tuple = (), quantize: str | None = None) -> dict:
    """Export ``model``'s segment reader and one-token step into the new (or empty) folder ``out``.

    Args:
        model: a float32 :class:`~txl.model.TransformerXLLM` (put in eval mode here).
        vocab: the checkpoint's ``vocab.json`` (copied beside the graphs).
        span: the span to decode with (``tgt_len`` tokens per prompt segment, ``mem_len``, ``clamp_len``,
            ``same_length``), as ``txl generate`` would.
        fmt: "onnx" (``torch.onnx.export``, dynamo; needs ``onnx`` and ``onnxscript``: the ``export``
            extra) or "pt2" (``torch.export.save``).
        inputs: files or folders the command reads (``out`` may not be one of them or lie inside one).
        quantize: "int8" (ONNX only; needs ``onnxruntime``): the graphs' weight products made dynamic int8
            (:func:`quantize_onnx_graph`); None: float32.

    Returns:
        The manifest written to ``out/export.json``.

    Raises:
        TxlError: what :func:`check_export` refuses; ``out`` that is not new or empty; a failed export
            (nothing is left in ``out`` then).
    """
    check_export(model, span, fmt, vocab, quantize)
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
        "logits": "log_probs" if c.cutoffs else "scores", "weights": quantize or "float32",
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
                        if quantize:
                            manifest.setdefault("int8_products", {})[key] = quantize_onnx_graph(path)
            shutil.copyfile(vocab, folder / "vocab.json")
            _readable_as_made(folder)
            write_json(folder / MANIFEST, manifest)  # last: a folder with export.json is complete
        except BaseException as err:
            for child in folder.iterdir():  # the folder was new or empty: leave it so
                shutil.rmtree(child) if child.is_dir() else child.unlink()
            if isinstance(err, (TxlError, KeyboardInterrupt)):
                raise
            raise TxlError(f"export failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                           "nothing was written") from err
    return manifest
