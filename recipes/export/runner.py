"""Greedy decoding with an exported decoder (``txl export``): ONNX Runtime, or ``torch.export``'s ``.pt2``.

The runner holds the ring state of :mod:`txl.model.graphs` as NumPy arrays: it reads the prompt
(all but its last token) in calls of ``tgt_len`` tokens to the segment graph, then calls the step
graph once per token and writes the new key and value into slot ``write`` in place (one slot per
layer and token), as ``txl generate`` keeps its ring buffers. Greedy tokens equal ``txl generate
--temperature 0``'s with the same ``--mem-len`` (and :func:`txl.generation.generate`'s with the exported
span; tests/export). :class:`ExportedDecoder` with ONNX graphs needs NumPy and ``onnxruntime`` only (the
``export`` extra); ``.pt2`` graphs need torch, and the command line below txl's tokenizer.

A ``.pt2`` archive can hold more than tensors and a graph (pickled objects, compiled libraries, shape
expressions that the loader evaluates), and ``torch.export.load`` would run them; the runner opens only
archives whose every entry is one of the kinds ``txl export`` writes (the graph as JSON, raw weights,
tensor constants, sample inputs read with ``weights_only``), whose graph calls only ATen operators,
whose shape expressions are products and sums of integers and size symbols, and whose weights are not
pickled; it refuses any other. Still, load only ``.pt2`` files you made or trust; for files from
others, ONNX holds no code.

::

    python -m txl_recipes.export.runner runs/default-onnx "ROMEO:" -n 40      # prints the prompt and 40 tokens
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from txl.config import MAX_THREADS, check_threads
from txl.errors import TxlError, UsageParser, clip_message
from txl.fileio import path_inside, read_json_object

_SIZES = ("capacity", "n_layer", "n_head", "d_head", "d_model", "vocab_size")
# the entries of a .pt2 archive that txl export writes (anything else could be code: see the module doc)
_PT2_ENTRIES = re.compile(r"[\w.-]+/(models/[\w.-]+\.json|data/weights/(weight_\d+|model_weights_config\.json)"
                          r"|data/constants/(tensor_\d+|model_constants_config\.json)|data/sample_inputs/[\w.-]+\.pt"
                          r"|archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id)")


def _check_manifest(m: dict, where: Path) -> None:
    """Raise TxlError unless ``m`` has every field the runner reads, of the right kind."""
    problems = [k for k in _SIZES if isinstance(m.get(k), bool) or not isinstance(m.get(k), int) or m[k] < 1]
    if m.get("format") not in ("onnx", "pt2"):
        problems.append("format")
    span = m.get("span")
    if not isinstance(span, dict) or any(isinstance(span.get(k), bool) or not isinstance(span.get(k), int)
                                         or span[k] < 1 for k in ("tgt_len", "mem_len")):
        problems.append("span")
    elif not (isinstance(span.get("clamp_len", 0), int) and not isinstance(span.get("clamp_len", 0), bool)
              and span.get("clamp_len", 0) >= 0 and isinstance(span.get("same_length", False), bool)):
        problems.append("span")
    for key in ("graphs", "inputs", "outputs"):
        if not isinstance(m.get(key), dict) or not all(g in m[key] for g in ("segment", "step")):
            problems.append(key)
    if not isinstance(m.get("vocab"), str):
        problems.append("vocab")
    for key, allowed in (("dtype", ("float32",)), ("logits", ("scores", "log_probs")),
                         ("weights", ("float32", "int8"))):
        if m.get(key) not in allowed:
            problems.append(key)
    if problems:
        raise TxlError(f"{where} is not a txl export manifest (bad or missing: {', '.join(problems)}); "
                       "export the model again with txl export")


def _expected_signature(m: dict) -> dict[str, dict[str, list]]:
    """What the graphs of manifest ``m`` take and give, as ``txl export`` writes them: per graph, its inputs
    and outputs as ``(dtype, dims)`` in the runner's order, each dim ``(manifest field, size)`` or
    ``("batch", None)`` for the dynamic batch."""
    span = m["span"]
    batch = ("batch", None)
    L, H, D = ("n_layer", m["n_layer"]), ("n_head", m["n_head"]), ("d_head", m["d_head"])
    S, d = ("capacity", m["capacity"]), ("d_model", m["d_model"])
    T, M = ("span.tgt_len", span["tgt_len"]), ("span.mem_len", span["mem_len"])
    ring = ("float32", [L, batch, H, S, D])
    ids, padding, count = ("int64", [batch, T]), ("int64", [batch]), ("int64", [])
    mems = ("float32", [L, batch, M, d])
    return {"segment": {"inputs": [ids, mems, padding, count], "outputs": [mems, padding, ring, ring, count]},
            "step": {"inputs": [("int64", [batch, ("one token", 1)]), ring, ring, count, count],
                     "outputs": [("float32", [batch, ("vocab_size", m["vocab_size"])]), ("float32", [L, batch, H, D]),
                                 ("float32", [L, batch, H, D])]}}


def _check_graphs(m: dict, found: dict[str, dict[str, list]], where: Path, names: bool) -> None:
    """Refuse a manifest ``m`` whose sizes, dtypes (or, with ``names``, input and output names) are not those
    of the graphs: ``found`` gives, per graph, its inputs and outputs as ``(name, dtype, shape)`` with None
    for a dynamic dim. Runs before any array is made, so a manifest's size never becomes an allocation.

    Raises:
        TxlError: the first field that disagrees, naming it, the graph and the input or output.
    """
    expected = _expected_signature(m)
    for graph in ("segment", "step"):
        for side in ("inputs", "outputs"):
            want, have = expected[graph][side], found[graph][side]
            listed = m[side].get(graph) if isinstance(m.get(side), dict) else None
            if len(have) != len(want):
                raise TxlError(f"{where}: the {graph} graph has {len(have)} {side}, not the {len(want)} of a txl export: "
                               "export the model again")
            if names and listed != [name for name, _, _ in have]:
                raise TxlError(f"{where}: the {graph} graph's {side} are {[name for name, _, _ in have]}, not those "
                               f"export.json lists ({listed}): export the model again")
            for i, ((name, dtype, shape), (want_dtype, dims)) in enumerate(zip(have, want)):
                if not names and isinstance(listed, list) and len(listed) == len(have):
                    name = listed[i]  # a .pt2's outputs are named after the nodes that made them
                name = f"{side[:-1]} {name}"
                if dtype != want_dtype:
                    raise TxlError(f"{where}: the {graph} graph's {name} is {dtype}, not {want_dtype}: export the "
                                   "model again")
                if len(shape) != len(dims):
                    raise TxlError(f"{where}: the {graph} graph's {name} has {len(shape)} dims, not {len(dims)}: "
                                   "export the model again")
                for size, (field, value) in zip(shape, dims):
                    if size != value:
                        said = "a fixed batch size" if field == "batch" else f"{field} {value:,}"
                        raise TxlError(f"{where} says {said}, but the {graph} graph's {name} has shape "
                                       f"{['batch' if x is None else x for x in shape]}: export the model again")


_SHAPE_EXPR = re.compile(r"(Mul|Add|FloorDiv|Mod|Max|Min|Integer\(-?\d+\)|"
                         r"Symbol\('s\d+'(, (positive|integer|nonnegative)=(True|False))*\)|[(), ])+")
_TARGET = re.compile(r"torch\.ops\.aten\.\w+(\.\w+)?|torch\.sym_\w+"
                     r"|_?operator\.(getitem|add|sub|mul|floordiv|truediv|mod|neg|pow|eq|ne|lt|le|gt|ge)")


def _odd_json(value, where: str) -> str | None:
    """The first field of a .pt2's JSON that is not what txl export writes (see the module doc), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, v in item.items():
                if key == "expr_str" and not (isinstance(v, str) and _SHAPE_EXPR.fullmatch(v)):
                    return f"the shape expression {str(v)[:60]!r} in {where}"
                if key == "target" and isinstance(v, str) and not _TARGET.fullmatch(v):
                    return f"a call of {v[:60]!r} in {where}"
                if key == "use_pickle" and v is not False:
                    return f"a pickled tensor in {where}"
                stack.append(v)
    return None


def check_pt2_archive(path: Path) -> None:
    """Refuse a ``.pt2`` archive holding anything but what ``txl export`` writes (see the module doc).

    Raises:
        TxlError: not a zip archive, an entry of another kind, or a graph or config field of another
            kind (named).
    """
    import json

    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            odd = [f"{n!r}" for n in names if not _PT2_ENTRIES.fullmatch(n)]
            for name in names:
                if not odd and name.endswith(".json"):
                    try:
                        found = _odd_json(json.loads(archive.read(name)), name)
                    except ValueError:
                        found = f"{name!r}, which is not JSON"
                    odd += [found] if found else []
    except (zipfile.BadZipFile, OSError) as err:
        raise TxlError(f"{path} is not a .pt2 archive ({err})") from None
    if odd:
        raise TxlError(f"{path} holds {odd[0]}, which is not what txl export writes (it could be code that "
                       "loading would run); txl does not load it")


def _pt2_signature(program) -> dict[str, list]:
    """The user inputs and outputs of an ``ExportedProgram`` as ``(name, dtype, shape)``, None for a
    symbolic (dynamic) dim."""
    nodes = {n.name: n for n in program.graph.nodes}
    output = next(n for n in program.graph.nodes if n.op == "output")

    def described(node) -> tuple:
        value = node.meta.get("val")
        shape = [d if isinstance(d, int) else None for d in getattr(value, "shape", ())]
        return node.name, str(getattr(value, "dtype", "?")).removeprefix("torch."), shape
    return {"inputs": [described(nodes[name]) for name in program.graph_signature.user_inputs],
            "outputs": [described(node) for node in output.args[0]]}


@dataclass
class Ring:
    """The decoding state: ``keys``/``values`` float32 [L, B, H, S, D]; ``write`` the next slot, ``fill``
    the filled slots (ints); ``last`` int64 [B, 1], the token the next step reads."""

    keys: np.ndarray
    values: np.ndarray
    write: int
    fill: int
    last: np.ndarray


class ExportedDecoder:
    """An exported decoder folder, ready to generate (see the module doc).

    Args:
        folder: what ``txl export`` wrote (``export.json``, the two graphs, ``vocab.json``).
        threads: intra-op threads for ONNX Runtime / torch, 1 to ``MAX_THREADS`` (None or 0: their
            default; the command line picks them as every txl command does, :func:`txl.runtime.pick_threads`).

    Raises:
        TxlError: ``threads`` out of range, a missing or malformed ``export.json``, a graph file missing,
            a manifest whose sizes, dtypes or names are not those of the graphs' inputs and outputs
            (checked before any array is made), ``onnxruntime`` missing for ONNX graphs.
    """

    def __init__(self, folder: str | os.PathLike[str], threads: int | None = None) -> None:
        check_threads(threads, "threads")  # (0, as None: the runtime's default)
        threads = threads or None
        self.folder = Path(folder)
        if not (self.folder / "export.json").is_file():
            raise TxlError(f"{self.folder} is not an exported decoder (no export.json): make one with txl export")
        m = read_json_object(self.folder / "export.json", "export manifest")
        _check_manifest(m, self.folder / "export.json")
        self.manifest = m
        self.tgt_len, self.mem_len = int(m["span"]["tgt_len"]), int(m["span"]["mem_len"])
        self.capacity = int(m["capacity"])
        paths = {k: path_inside(self.folder, m["graphs"].get(k), "export.json graphs") for k in ("segment", "step")}
        for path in paths.values():
            if not path.is_file():
                raise TxlError(f"{path} is missing: export the model again")
        self._run = self._onnx(paths, threads) if m["format"] == "onnx" else self._pt2(paths, threads)

    def _onnx(self, paths: dict, threads: int | None):
        try:
            import onnxruntime as ort
        except ImportError:
            raise TxlError("ONNX graphs need onnxruntime: pip install onnxruntime (or txl's '.[export]' extra)") from None
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            sessions = {k: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
                        for k, p in paths.items()}
        except Exception as err:  # a truncated graph, its .onnx.data missing: ONNX Runtime's own exception types
            raise TxlError(f"ONNX Runtime cannot open the graphs of {self.folder}: {str(err).splitlines()[0]}") from None
        kinds = {"tensor(float)": "float32", "tensor(int64)": "int64"}

        def described(args) -> list:
            return [(a.name, kinds.get(a.type, a.type), [d if isinstance(d, int) else None for d in a.shape or []])
                    for a in args]
        found = {k: {"inputs": described(sess.get_inputs()), "outputs": described(sess.get_outputs())}
                 for k, sess in sessions.items()}
        _check_graphs(self.manifest, found, self.folder / "export.json", names=True)
        names = self.manifest["inputs"]

        def run(graph: str, *arrays: np.ndarray) -> list[np.ndarray]:
            try:
                return sessions[graph].run(None, dict(zip(names[graph], arrays)))
            except Exception as err:
                raise TxlError(f"the {graph} graph of {self.folder} failed: {str(err).splitlines()[0]}") from None
        return run

    def _pt2(self, paths: dict, threads: int | None):
        import torch

        if threads:
            torch.set_num_threads(threads)
        for path in paths.values():
            check_pt2_archive(path)
        before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
        os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"  # a .pt2's tensors are read without unpickling code
        try:
            programs = {k: torch.export.load(str(p)) for k, p in paths.items()}
        except Exception as err:
            raise TxlError(f"cannot load the .pt2 graphs of {self.folder}: {str(err).splitlines()[0]}") from None
        finally:
            if before is None:
                os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
            else:
                os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = before
        _check_graphs(self.manifest, {k: _pt2_signature(p) for k, p in programs.items()}, self.folder / "export.json",
                      names=False)  # a .pt2 is called by position: its placeholders keep the module's own names
        modules = {k: p.module() for k, p in programs.items()}

        def run(graph: str, *arrays: np.ndarray) -> list[np.ndarray]:
            try:
                with torch.no_grad():
                    out = modules[graph](*(torch.from_numpy(np.asarray(a)) for a in arrays))
            except Exception as err:
                raise TxlError(f"the {graph} graph of {self.folder} failed: {str(err).splitlines()[0]}") from None
            return [t.numpy() for t in out]
        return run

    def read_prompt(self, input_ids: np.ndarray) -> Ring:
        """The state after reading ``input_ids`` (int64 [B, T], T >= 1) but its last token, which the first
        :meth:`step` reads.

        Raises:
            TxlError: ``input_ids`` that is not [B, T] with B, T >= 1 and ids in the vocabulary.
        """
        ids = np.asarray(input_ids)
        m = self.manifest
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1 or ids.dtype.kind not in "iu":
            raise TxlError(f"input_ids must be integers [batch, length] with batch, length >= 1, got shape {ids.shape}")
        if ids.min() < 0 or ids.max() >= m["vocab_size"]:
            raise TxlError(f"token ids must be in [0, {m['vocab_size']}), got {int(ids.min())} ... {int(ids.max())}")
        ids = ids.astype(np.int64)
        bsz, length = ids.shape
        shape = (m["n_layer"], bsz, m["n_head"], self.capacity, m["d_head"])
        keys, values, fill = np.zeros(shape, np.float32), np.zeros(shape, np.float32), 0
        mems = np.zeros((m["n_layer"], bsz, self.mem_len, m["d_model"]), np.float32)
        padding = np.full((bsz,), self.mem_len, np.int64)
        for start in range(0, length - 1, self.tgt_len):
            chunk = ids[:, start:min(start + self.tgt_len, length - 1)]
            n = chunk.shape[1]
            chunk = np.concatenate([chunk, np.zeros((bsz, self.tgt_len - n), np.int64)], axis=1)
            mems, padding, keys, values, fill = self._run("segment", chunk, mems, padding, np.array(n, np.int64))
            keys, values = np.ascontiguousarray(keys), np.ascontiguousarray(values)
        return Ring(keys, values, int(fill) % self.capacity, int(fill), ids[:, -1:])

    def step(self, ring: Ring) -> np.ndarray:
        """Read ``ring.last`` int64 [B, 1]; returns the next-token logits float32 [B, V] and writes the
        token's key and value into slot ``ring.write`` (then moves the counters on).

        Raises:
            TxlError: the graph fails (e.g. a ring of another shape than the export's).
        """
        logits, key, value = self._run("step", ring.last, ring.keys, ring.values,
                                       np.array(ring.write, np.int64), np.array(ring.fill, np.int64))
        ring.keys[:, :, :, ring.write] = key
        ring.values[:, :, :, ring.write] = value
        ring.write = (ring.write + 1) % self.capacity
        ring.fill = min(ring.fill + 1, self.capacity)
        return logits

    def greedy(self, input_ids: np.ndarray, max_new_tokens: int) -> np.ndarray:
        """``input_ids`` (int64 [B, T]) followed by ``max_new_tokens`` greedy tokens: int64 [B, T + n].

        Raises:
            TxlError: as :meth:`read_prompt`, or ``max_new_tokens < 0``.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
            raise TxlError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        ring = self.read_prompt(input_ids)
        out = [ring.last.copy()]
        for _ in range(max_new_tokens):
            ring.last = self.step(ring).argmax(-1).astype(np.int64)[:, None]
            out.append(ring.last)
        return np.concatenate([np.asarray(input_ids, np.int64)[:, :-1], *out], axis=1)


def main(argv: list[str] | None = None) -> int:
    """``python -m txl_recipes.export.runner FOLDER PROMPT [-n N] [--threads N]``: print the prompt and its greedy
    continuation. The arguments are checked as the ``txl`` commands check theirs, before anything is
    loaded; the threads are chosen by their rule (:func:`txl.runtime.pick_threads`) and said on stderr."""
    p = UsageParser(prog="python -m txl_recipes.export.runner", description=__doc__.split("\n")[0],
                epilog='example: python -m txl_recipes.export.runner runs/default-onnx "ROMEO:" -n 40')
    p.add_argument("folder", help="what txl export wrote")
    p.add_argument("prompt", help="the text to continue")
    p.add_argument("-n", "--max-new-tokens", type=int, default=64, metavar="N",
                   help="tokens to generate after the prompt (default 64)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help=f"intra-op threads, 1 to {MAX_THREADS} (default, or 0: OMP_NUM_THREADS if set, else the CPUs "
                        "this process may use less those busy with other work, as every txl command)")
    args = p.parse_args(argv)
    try:
        check_threads(args.threads, "--threads")  # the rule of every txl command, before anything is loaded
        if args.max_new_tokens < 0:
            raise TxlError(f"-n/--max-new-tokens must be >= 0, got {args.max_new_tokens}")
        if not args.prompt:
            raise TxlError("the prompt is empty: give at least one character")
        if not os.path.isdir(args.folder):
            raise TxlError(f"{args.folder} " + ("is not a folder" if os.path.exists(args.folder) else "does not exist")
                           + ": give the folder txl export wrote")
        from txl.data.tokenizers import load_tokenizer
        from txl.runtime import pick_threads

        threads, said = pick_threads(args.threads or None)  # the rule and the range check of every txl command
        decoder = ExportedDecoder(args.folder, threads)
        tokenizer = load_tokenizer(path_inside(decoder.folder, decoder.manifest["vocab"], "export.json vocab"))
        if tokenizer.vocab_size > decoder.manifest["vocab_size"]:  # its ids would fall outside the graphs' vocabulary
            raise TxlError(f"{decoder.folder}: vocab.json holds {tokenizer.vocab_size:,} tokens, more than the "
                           f"vocab_size {decoder.manifest['vocab_size']:,} of the graphs: export the model again")
        ids = np.asarray(tokenizer.encode(args.prompt), np.int64)
        if ids.size == 0:
            raise TxlError("the prompt encodes to no tokens: give a longer prompt")
        print(f"txl: using {decoder.folder} ({decoder.manifest['format']}); {said}", file=sys.stderr, flush=True)
        out = decoder.greedy(ids[None], args.max_new_tokens)
        print(tokenizer.decode(out[0].tolist()))
    except TxlError as err:
        print(f"txl: error: {clip_message(str(err), inputs=[args.folder, args.prompt])}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("txl: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
