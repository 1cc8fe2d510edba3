"""What every ``txl`` command shares: the flags defined once, loading a checkpoint, and writing the result
(``--json``, the start-line notes). The checks of the arguments, run before any work, are in
:mod:`txl.cli.checks`.

The grammar (see docs/cli.md): long flags are spelled with hyphens; the underscore spellings
(``--tgt_len``) are accepted as hidden aliases, never shown by ``--help``. The checkpoint is always
a positional argument, data is always ``--data``, and ``--json FILE|-`` writes the result as JSON
to FILE, or to stdout with ``-``.

Nothing here imports torch at module level: building the parser and reporting a usage error must
not need it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import json
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

from txl.cli.checks import finite_float, flag_name
from txl.config import CHECKPOINT_NAMES, DTYPES, SPAN_FIELDS  # txl.config imports no torch
from txl.errors import TxlError


@dataclass(frozen=True)
class Command:
    """One subcommand of a command group (``txl classify train``): the same attributes as a command module."""

    NAME: str
    HELP: str
    EXAMPLE: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    DETAILS: str = ""


def add_option(parser: argparse.ArgumentParser, *names: str, aliases: tuple[str, ...] = (), **kwargs) -> argparse.Action:
    """``parser.add_argument(*names, **kwargs)`` plus each of ``aliases`` as a hidden spelling of it.

    The aliases store into the same destination and are left out of ``--help`` (docs/cli.md, "Other
    spellings accepted").
    """
    action = parser.add_argument(*names, **kwargs)
    hidden = {k: v for k, v in kwargs.items() if k not in ("help", "default", "required", "metavar", "dest")}
    for alias in aliases:
        parser.add_argument(alias, dest=action.dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **hidden)
    return action


def underscore(name: str) -> tuple[str, ...]:
    """The hidden underscore alias of a hyphenated long flag (``--tgt-len`` -> ``("--tgt_len",)``), if any."""
    alias = "--" + name[2:].replace("-", "_")
    return (alias,) if alias != name else ()


def add_device(parser: argparse.ArgumentParser, threads_text: str = "automatic") -> None:
    """``--device auto|cpu|cuda|cuda:N`` (default auto: cuda when available), and ``--threads N``
    (:func:`add_threads`, its default said as ``threads_text``): every command that runs a model has both."""
    parser.add_argument("--device", default="auto", help="auto (default: cuda when available), cpu, cuda or cuda:N")
    add_threads(parser, threads_text)


def add_threads(parser: argparse.ArgumentParser, default_text: str = "automatic") -> None:
    """``--threads N``: torch's CPU threads (0 or unset: ``OMP_NUM_THREADS`` when set, else the CPUs this
    process may use less the busy ones; see :func:`txl.runtime.choose_threads`)."""
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help=f"CPU threads for torch (default: {default_text}; 0 or unset: OMP_NUM_THREADS if set, "
                             "else the CPUs this process may use less those busy with other work, at least 1)")


def use_threads(args: argparse.Namespace) -> str:
    """Set torch's CPU threads for this command once, from ``--threads`` (:func:`txl.runtime.set_threads`);
    returns the text for the command's start line (``"threads 1 (2 CPUs, load 1.3, busy now 1.0)"``).

    Raises:
        TxlError: a ``--threads`` out of range.
    """
    text = args.__dict__.get("_threads_text")
    if text is None:
        from txl.runtime import set_threads

        text = args._threads_text = set_threads(getattr(args, "threads", None) or None, flag=flag_name(args, "threads"))
    return text


def note_threads(args: argparse.Namespace) -> None:
    """:func:`use_threads`, and the start line ``txl: threads 1 (2 CPUs, load 1.3, busy now 1.0)`` kept
    for :func:`print_notes`, for a command that names no checkpoint in its start line (``txl bench``,
    ``txl recl``, ``txl plot``, ``txl classify``): printed once its input has passed its checks."""
    args.__dict__.setdefault("_notes", []).append(f"txl: {use_threads(args)}")


def add_dtype(parser: argparse.ArgumentParser, default: str | None = "float32") -> None:
    """``--dtype float32|bfloat16|float16``: float32, or autocast to a half-precision type."""
    parser.add_argument("--dtype", choices=DTYPES, default=default,
                        help=f"float32, or autocast to bfloat16/float16 (default {default or 'the config'})")


def add_quantize(parser: argparse.ArgumentParser) -> None:
    """``--quantize int8``: the checkpoint's linear layers with int8 weights (:mod:`txl.kernels.int8`)."""
    parser.add_argument("--quantize", choices=("none", "int8", "bf16"), default="none",
                        help="int8: every linear layer with int8 weights, one scale per output channel; bf16: every "
                             "weight in bfloat16 (inference only; see docs/quantization.md; default none)")


def add_batch_size(parser: argparse.ArgumentParser, default: int | None = None, text: str = "batch size",
                   aliases: tuple[str, ...] = (), default_text: str = "the config") -> None:
    """``--batch-size N`` (hidden alias ``--batch_size``); ``default_text`` is what ``--help`` says of a None
    default."""
    add_option(parser, "--batch-size", aliases=("--batch_size", *aliases), type=int, default=default, metavar="N",
               help=f"{text} (default: {default if default is not None else default_text})")


def add_span(parser: argparse.ArgumentParser, names: tuple[str, ...] = SPAN_FIELDS,
             default_text: str = "the checkpoint's eval config", memory_needed: bool = False) -> None:
    """The attention-span flags ``--tgt-len --mem-len --clamp-len --same-length/--no-same-length``.

    Each defaults to None (take the value from the checkpoint or config); ``names`` picks a subset.
    ``memory_needed``: the command refuses ``--mem-len 0`` (``span_minimum``, read by
    :func:`~txl.cli.checks.check_shared_flags`), and the help says so.
    """
    if memory_needed:
        parser.set_defaults(span_minimum={"mem_len": 1})
    texts = {"tgt_len": "tokens per segment", "mem_len": "memory length (>= 1)" if memory_needed else
             "memory length (0: none)",
             "clamp_len": "clamp relative distances at this value (0: none)",
             "cmem_len": "compressed-memory slots per layer (0: none; a compressive model only)"}
    for name in names:
        flag = "--" + name.replace("_", "-")
        if name == "same_length":
            add_option(parser, flag, aliases=("--same_length",), action=argparse.BooleanOptionalAction, default=None,
                       help=f"every query sees the same number of keys (default: {default_text})")
        else:
            add_option(parser, flag, aliases=underscore(flag), type=int, default=None, metavar="N",
                       help=f"{texts[name]} (default: {default_text})")


def add_seed(parser: argparse.ArgumentParser, default: int | None = None, text: str = "random seed",
             unset: str = "random") -> None:
    """``--seed N``; ``unset`` says in the help what happens without it (when ``default`` is None)."""
    parser.add_argument("--seed", type=int, default=default, metavar="N",
                        help=f"{text} (default: {default if default is not None else unset})")


def add_json(parser: argparse.ArgumentParser, bare: bool = False, what: str = "the result") -> None:
    """``--json FILE|-``: write ``what`` as JSON to FILE, or to stdout with ``-``.

    With ``bare``, a ``--json`` without a value means ``-`` (a spelling ``txl eval`` accepts).
    """
    extra = {"nargs": "?", "const": "-"} if bare else {}
    parser.add_argument("--json", metavar="FILE|-", default=None, **extra,
                        help=f"write {what} as JSON to FILE, or to stdout with -" + (" (the default)" if bare else ""))


def add_data(parser: argparse.ArgumentParser, text: str, required: bool = False,
             aliases: tuple[str, ...] = ()) -> None:
    """``--data PATH``: a text file or directory (or what ``text`` says)."""
    add_option(parser, "--data", aliases=aliases, metavar="PATH", default=None, required=required, help=text)


def add_checkpoint(parser: argparse.ArgumentParser, option_alias: bool = False,
                   text: str = "checkpoint directory, or a run directory (uses its best/)") -> None:
    """The positional ``checkpoint``; with ``option_alias``, also ``--checkpoint CKPT`` (hidden).

    With the alias the positional is optional to argparse; :func:`checkpoint_arg` settles which was given.
    """
    if option_alias:
        parser.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT", help=text)
        parser.add_argument("--checkpoint", dest="checkpoint_option", default=None, help=argparse.SUPPRESS)
    else:
        parser.add_argument("checkpoint", metavar="CHECKPOINT", help=text)



def add_checkpoint_name(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint-name best|last``: which checkpoint of a run directory to use (default best/, else last/).

    After an interrupted run ``best/`` may be older than ``last/``; a checkpoint folder such as
    ``RUN/last`` can also be given directly as the CHECKPOINT.
    """
    add_option(parser, "--checkpoint-name", aliases=underscore("--checkpoint-name"), choices=CHECKPOINT_NAMES,
               default=None, help="with a run directory: use its best/ (the default; last/ when there is no best/) "
                                  "or its last/ checkpoint")


def checkpoint_arg(args: argparse.Namespace, rest: str | None = None) -> str:
    """The checkpoint a command was given, positionally or by the hidden ``--checkpoint`` option.

    With ``rest`` (the name of a list of further positionals, e.g. score's files) and the option
    given, the first positional belongs to that list: ``txl score --checkpoint CKPT a.txt b.txt``.

    Raises:
        TxlError: no checkpoint, or one given both ways.
    """
    option = getattr(args, "checkpoint_option", None)
    if option is None:
        if args.checkpoint is None:
            raise TxlError("give the CHECKPOINT (a checkpoint or run directory) as the first argument")
        return args.checkpoint
    if args.checkpoint is not None:
        if rest is None:
            raise TxlError(f"give the checkpoint once: {args.checkpoint} and --checkpoint {option}")
        setattr(args, rest, [args.checkpoint, *getattr(args, rest)])
    args.checkpoint = option
    return option


def visible_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{dest: "-n/--max-new-tokens"}`` for every option of ``parser`` that ``--help`` shows (hidden aliases left out)."""
    found: dict[str, str] = {}
    for action in parser._actions:
        if action.option_strings and action.help is not argparse.SUPPRESS and action.dest not in found:
            found[action.dest] = "/".join(sorted(action.option_strings, key=lambda o: o.startswith("--")))
    return found


@contextlib.contextmanager
def interrupted_by(signum: int):
    """While the block runs, the signal ``signum`` raises :class:`KeyboardInterrupt` (which :func:`txl.cli.main`
    ends with the one line ``txl: interrupted`` and exit status 130); the handler found is restored after.
    Nothing changes outside the main thread, where signals cannot be handled."""
    previous = (signal.signal(signum, signal.default_int_handler)
                if threading.current_thread() is threading.main_thread() else None)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signum, previous)


class _HeldLoader:
    """A module's loader whose :meth:`exec_module` runs with SIGINT held back, then raises the
    :class:`KeyboardInterrupt` of a Ctrl-C that came meanwhile; everything else is the real loader's."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        held = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
        try:
            self.loader.exec_module(module)
        finally:
            signal.signal(signal.SIGINT, previous)
            module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its real loader
        if held:
            raise KeyboardInterrupt


class _HoldInterruptsWhileImporting(importlib.abc.MetaPathFinder):
    """Finds the top-level module ``name`` as the path finder does, with a :class:`_HeldLoader`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _HeldLoader(spec.loader)
        return spec


@contextlib.contextmanager
def interrupts_held_while_importing(name: str):
    """While the block runs, the first import of module ``name`` runs with SIGINT held back and raises the
    :class:`KeyboardInterrupt` of a Ctrl-C that came meanwhile once the module's code has run. torch's import
    swallows an interrupt raised inside it (and may leave numpy half initialised, to fail a later step), so
    without this a Ctrl-C in the second or two a command spends importing torch would be lost. The import
    stays where each command makes it: after its checks of arguments and paths. Nothing changes outside
    the main thread (no signals there) or when ``name`` is imported already."""
    if name in sys.modules or threading.current_thread() is not threading.main_thread():
        yield
        return
    finder = _HoldInterruptsWhileImporting(name)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def pick(cli: Any, config: Any) -> Any:
    """The value given on the command line, else the configured one."""
    return cli if cli is not None else config


def span_args(args: argparse.Namespace, eval_config) -> dict[str, Any]:
    """``tgt_len``, ``mem_len``, ``clamp_len``, ``same_length``, ``cmem_len``: the flags, else the
    checkpoint's eval config (a flag the command does not have counts as not given)."""
    return {name: pick(getattr(args, name, None), getattr(eval_config, name, None)) for name in SPAN_FIELDS}


def add_decoding_flags(p: argparse.ArgumentParser, *, max_new_tokens: int, max_new_help: str, temperature: float,
                       stop_help: str, beam_help: str, ranked: str) -> None:
    """The decoding flags of ``txl generate`` and ``txl summarize``: ``-n``, the sampling flags that
    :func:`decoding_rules` reads, ``--stop``, ``--num-beams`` and ``--length-penalty``. The defaults of
    ``-n`` and ``--temperature`` and the texts naming what is decoded are the command's."""
    add_option(p, "-n", "--max-new-tokens", aliases=underscore("--max-new-tokens"), type=int, default=max_new_tokens,
               metavar="N", help=f"{max_new_help} (default {max_new_tokens})")
    # None until check_decoding_flags: it tells a --temperature given from the command's default
    p.add_argument("--temperature", "-t", type=finite_float, default=None,
                   help=f"0 = greedy (default {temperature:g})")
    add_option(p, "--top-k", aliases=underscore("--top-k"), type=int, default=None, metavar="K",
               help="sample among the K most likely tokens")
    add_option(p, "--top-p", aliases=underscore("--top-p"), type=finite_float, default=None, metavar="P",
               help="nucleus sampling: among the most likely tokens holding probability P")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help=stop_help)
    add_option(p, "--min-new-tokens", aliases=underscore("--min-new-tokens"), type=int, default=0, metavar="N",
               help="no stop (and for a fine-tuned model no end marker) before N new tokens (default 0)")
    add_option(p, "--repetition-penalty", aliases=underscore("--repetition-penalty"), type=finite_float, default=1.0,
               metavar="F", help="divide the positive scores of tokens already generated by F, multiply the "
                                 "negative ones (CTRL; 1: none, the default)")
    add_option(p, "--no-repeat-ngram-size", aliases=underscore("--no-repeat-ngram-size"), type=int, default=0,
               metavar="N", help="never repeat an N-gram of the generated tokens (0: off, the default)")
    add_option(p, "--num-beams", aliases=underscore("--num-beams"), type=int, default=1, metavar="N", help=beam_help)
    add_option(p, "--length-penalty", aliases=underscore("--length-penalty"), type=finite_float, default=1.0,
               metavar="F", help=f"beam search: finished {ranked} ranked by log-prob / length**F (default 1)")
    p.set_defaults(_temperature_default=temperature)


def decoding_rules(args: argparse.Namespace):
    """The :class:`~txl.generation.DecodingRules` of a decoding command's flags (``--temperature``,
    ``--top-k``, ``--top-p``, ``--repetition-penalty``, ``--no-repeat-ngram-size``, ``--min-new-tokens``;
    a command without one of them keeps that rule's default). Imports torch."""
    from txl.generation import DecodingRules

    fields = ("temperature", "top_k", "top_p", "repetition_penalty", "no_repeat_ngram_size", "min_new_tokens")
    return DecodingRules(**{f: getattr(args, f) for f in fields if getattr(args, f, None) is not None})


def end_ids(ckpt) -> tuple[int, ...]:
    """The end-of-completion marker of a fine-tuned checkpoint (``txl finetune``), where its text ends
    and which ``--min-new-tokens`` holds back (``txl generate``, ``txl serve``); none for a language model."""
    if ckpt.run.finetune is None:
        return ()
    from txl.data.pairs import find_markers

    return (find_markers(ckpt.tokenizer).end_id,)


def load_checkpoint(args: argparse.Namespace, path: str | None = None, announce: bool = False):
    """Load the command's checkpoint (``path``, else ``args.checkpoint``) onto ``--device``.

    ``args.checkpoint_name`` (``--checkpoint-name``, when the command has it) picks best/ or last/ of a
    run directory; ``--quantize int8`` (when the command has it) gives the model int8 weights. torch's CPU threads are set first (``--threads``, :func:`use_threads`). With
    ``announce``, one line on stderr says which checkpoint was loaded and at which step, and the
    threads (``txl: using runs/x/best (step 600; last/ is at step 700); threads 1 (2 CPUs, load 1.3,
    busy now 1.0)``), and a half-precision ``--dtype`` the CPU has no native support for gets a warning (see
    :func:`slow_dtype_warning`).

    Returns:
        (checkpoint, device): a :class:`txl.training.checkpoint.Checkpoint` and the resolved torch device.
    """
    from txl import runtime
    from txl.runtime import resolve_device
    from txl.training.checkpoint import describe_checkpoint
    from txl.training.checkpoint import load_checkpoint as load

    device = resolve_device(args.device)
    threads = use_threads(args)
    ckpt = load(path if path is not None else args.checkpoint, map_location=str(device),
                name=getattr(args, "checkpoint_name", None))
    from txl.kernels.int8 import is_quantized, quantize_int8, to_bfloat16

    quantize = getattr(args, "quantize", "none")
    int8 = is_quantized(ckpt.model)  # a checkpoint written with int8 weights
    if quantize == "bf16":
        if int8:
            raise TxlError(f"{ckpt.path} holds int8 weights; --quantize bf16 needs a float checkpoint")
        to_bfloat16(ckpt.model)
    elif quantize == "int8" and not int8:
        quantize_int8(ckpt.model)
        int8 = True
    quantized = "; int8 weights" if int8 else "; bf16 weights" if quantize == "bf16" else ""
    if announce:  # said once the command's input has passed its checks (see print_notes)
        notes = args.__dict__.setdefault("_notes", [])
        notes.append(f"txl: using {describe_checkpoint(ckpt.path)}{quantized}; {threads}")
        warning = (slow_dtype_warning(device, "bfloat16", "--quantize bf16") if quantize == "bf16"
                   else slow_dtype_warning(device, getattr(args, "dtype", None)))
        if warning:
            notes.append(warning)
        if int8 and device.type == "cpu" and not runtime.native_dtype_support(device, "int8"):
            notes.append("txl: warning: this CPU has no int8 dot-product instructions (VNNI): int8 weights run "
                         "several times slower than float32 here (use the float checkpoint"
                         f"{', or drop --quantize int8' if quantize == 'int8' else ''})")
        if int8 and device.type != "cpu":
            notes.append(f"txl: warning: int8 weights have no {device.type} kernel here: each product multiplies by the "
                         "dequantised weight, slower than float32 and without the rounding of the inputs (use them "
                         "on a CPU, or the float checkpoint)")
    return ckpt, device


def print_notes(args: argparse.Namespace) -> None:
    """Print (stderr) and forget the lines :func:`load_checkpoint` and :func:`note_threads` kept back:
    which checkpoint, the threads, slow dtype.

    Commands call this when their input has passed its checks and the work begins, so that bad
    input is still reported as one ``txl: error:`` line; :func:`txl.cli.main` calls it after a
    command that returned without doing so.
    """
    for line in args.__dict__.pop("_notes", []):
        print(line, file=sys.stderr, flush=True)


def slow_dtype_warning(device, dtype: str | None, flag: str | None = None) -> str | None:
    """The ``txl: warning:`` line for a ``dtype`` that ``device`` only emulates (a CPU without native
    bfloat16/float16 arithmetic, many times slower than float32), naming ``flag``, the flag that asked
    for it (default ``--dtype DTYPE``); None when there is nothing to say."""
    from txl import runtime

    if dtype and dtype != "float32" and not runtime.native_dtype_support(device, dtype):
        flag = flag or f"--dtype {dtype}"
        return (f"txl: warning: this CPU has no native {dtype} support: {flag} will be much slower than "
                f"float32 (drop {flag} here)")
    return None


def emit_json(destination: str, obj: Any, force: bool = False) -> None:
    """``--json`` output: one line of JSON on stdout for ``-``, else an indented JSON file, written atomically.

    The file replaces an existing one only with ``force`` (check it first with :func:`txl.cli.checks.check_output`).

    Raises:
        TxlError: without ``force``, a file that exists at ``destination`` (left as it was).
    """
    if destination == "-":
        print(json.dumps(obj))
        sys.stdout.flush()
    else:
        from txl.fileio import write_json

        write_json(destination, obj, overwrite=force, make_parents=False)  # its folder was checked to exist


def add_force(parser: argparse.ArgumentParser) -> None:
    """``--force``: replace an existing output file (never an input, nor a file in a checkpoint or run folder)."""
    parser.add_argument("--force", action="store_true",
                        help="replace an existing output file (inputs and checkpoint or run folders are never written)")


def human_stream(args: argparse.Namespace):
    """Where the human-readable report goes: stderr when ``--json -`` claims stdout, else stdout."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


def model_name(path) -> str:
    """The model's name in answers and plots: its run folder's name (``runs/cpu-tiny/best`` -> ``cpu-tiny``),
    never a path of the machine."""
    from pathlib import Path

    path = Path(path)
    base = path.name.split(".")[0]
    return path.parent.name if base in CHECKPOINT_NAMES and path.parent.name else path.name
