"""The checks of a ``txl`` command's arguments that run before any work, and before torch is imported:
finite numbers and integer lists (the argparse ``type`` of float flags, :func:`parse_ints`), input paths
that must exist (:func:`check_exists`), output files that may be written
(:func:`check_output`), optional packages (:func:`require_installed`), flag values and their ranges
(:func:`check_shared_flags`, run by :func:`txl.cli.main` for every command, :func:`check_range`,
:func:`check_decoding_flags`) and the keys of a JSON Lines input (:func:`check_line_keys`).

Each failure is one :class:`~txl.errors.TxlError` (or, for an argparse ``type``, an
``argparse.ArgumentTypeError``) naming the flag as ``--help`` shows it and what to give instead.
The flags themselves are defined in :mod:`txl.cli.common`.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os

from txl.config import SPAN_MINIMUM, check_decoding, check_sampling, check_seed, check_threads, check_weights_dtype
from txl.errors import TxlError, listed, quoted


def flag_name(args: argparse.Namespace, dest: str) -> str:
    """The flag that sets ``dest`` as ``--help`` shows it, short form included (``-n/--max-new-tokens``).

    Taken from the parser the command was built with (see :func:`txl.cli.main`); a namespace made
    elsewhere gets the long form spelled from ``dest``.
    """
    flags = getattr(args, "_flags", None) or {}
    return flags.get(dest) or f"--{dest.replace('_', '-')}"


def finite_float(text: str) -> float:
    """The argparse ``type`` of every float flag: a finite number (``nan``, ``inf`` and ``-inf`` are refused).

    Raises:
        argparse.ArgumentTypeError: not a number, or not finite (argparse reports it as one
            ``txl: error: argument --flag: ...`` line).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def parse_ints(text: str, flag: str, minimum: int) -> list[int]:
    """The comma-separated integers of a list flag (``--sweep-mem 0,128,256``), in the order given.

    Raises:
        TxlError: a value that is not an integer or is below ``minimum``, or no value at all
            (naming ``flag``).
    """
    wanted = "positive integers" if minimum == 1 else f"integers >= {minimum}"
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise TxlError(f"{flag} needs comma-separated {wanted}, got {text!r}") from None
    if not values or min(values) < minimum:
        raise TxlError(f"{flag} needs comma-separated {wanted}, got {text!r}")
    return values


def check_exists(path: str | None, what: str, kind: str | None = None, hint: str = "") -> None:
    """Refuse a missing input before anything heavy is imported or loaded (torch-free, one line).

    Args:
        path: the path as the user gave it; None passes.
        what: how the message names it (``"checkpoint"``, ``"--data"``, ``"input"``).
        kind: ``"file"`` or ``"folder"`` when it must be one of them; None: either.
        hint: what to give instead, added to the message (``"give a run directory with metrics.csv"``).

    Raises:
        TxlError: ``{what} {path} does not exist``, or is a folder/file where the other is needed.
    """
    if path is None:
        return
    if not os.path.exists(path):
        problem = "does not exist"
    elif kind == "file" and os.path.isdir(path):
        problem = "is not a file (it is a folder)"
    elif kind == "folder" and not os.path.isdir(path):
        problem = "is not a folder (it is a file)"
    else:
        return
    raise TxlError(f"{what} {path} {problem}" + (f" ({hint})" if hint else ""))


def require_installed(*modules: str, message: str) -> None:
    """Refuse, before any work, a command that needs an optional package which is not installed.

    Only looks the modules up (``importlib.util.find_spec``); nothing is imported.

    Raises:
        TxlError: ``message`` (which says what to install) when one of ``modules`` is missing.
    """
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a stub in sys.modules (None, or without a spec)
            found = False
        if not found:
            raise TxlError(message)


def check_output(args: argparse.Namespace, path: str | None, inputs=(), flag: str = "--out",
                 makes_folder: bool = False) -> None:
    """Refuse the user-named output file ``path`` before any work (:func:`txl.fileio.check_output_path`
    with ``args.force``; ``makes_folder`` for a file in a folder the command creates, ``txl plot --out``);
    ``None`` and ``-`` (stdout) pass.

    Raises:
        TxlError: ``path`` is a folder, its folder is missing (unless ``makes_folder``), a file or not
            writable, ``path`` is one of ``inputs`` or inside an input folder, inside a checkpoint or run
            folder, something other than a regular file (a symbolic link, a device, a FIFO; even with
            ``--force``), or an existing file without ``--force``.
    """
    if path is None or path == "-":
        return
    from txl.fileio import check_output_path

    check_output_path(path, inputs, force=getattr(args, "force", False), flag=flag, makes_folder=makes_folder)


def check_range(args: argparse.Namespace, minimum: int, *names: str) -> None:
    """Every given (not None) option among ``names`` is >= ``minimum``.

    Raises:
        TxlError: naming the flag as the user spelled it in the documented grammar (``--tgt-len``).
    """
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < minimum:
            raise TxlError(f"{flag_name(args, name)} must be >= {minimum}, got {value}")


def check_shared_flags(args: argparse.Namespace) -> None:
    """The flags several commands share, checked by :func:`txl.cli.main` for every command before it runs
    (torch-free): ``--threads`` in ``[0, MAX_THREADS]``, the attention-span flags (``--tgt-len`` >= 1;
    ``--mem-len``, ``--clamp-len``, ``--cmem-len`` >= 0, or the stricter minimum a command sets as its
    ``span_minimum`` default), ``--seed`` in ``[0, 2**32)`` and the pair
    ``--quantize``/``--dtype`` (the rules of :mod:`txl.config`: :func:`~txl.config.check_threads`,
    :func:`~txl.config.check_seed`, :func:`~txl.config.check_weights_dtype`).

    Raises:
        TxlError: the first value out of range, naming the flag as ``--help`` shows it.
    """
    check_threads(getattr(args, "threads", None), flag_name(args, "threads"))
    for name, minimum in {**SPAN_MINIMUM, **getattr(args, "span_minimum", {})}.items():
        check_range(args, minimum, name)
    check_seed(getattr(args, "seed", None), flag_name(args, "seed"))
    if getattr(args, "quantize", None) == "bf16":
        # bf16 weights compute in bfloat16: --dtype float32 (the default) or bfloat16, never float16
        dtype = flag_name(args, "dtype")
        check_weights_dtype("bfloat16", getattr(args, "dtype", None), f"{flag_name(args, 'quantize')} bf16",
                            f"{dtype} {getattr(args, 'dtype', None)}", f"use {dtype} bfloat16 or float32 (the default)")


def check_decoding_flags(args: argparse.Namespace) -> None:
    """The decoding flags of ``txl generate`` and ``txl summarize`` (:func:`txl.cli.common.add_decoding_flags`),
    before torch loads: the sampling and decoding settings (:func:`~txl.config.check_sampling`,
    :func:`~txl.config.check_decoding`), ``-n/--max-new-tokens`` >= 0, and ``--min-new-tokens`` at most
    ``-n/--max-new-tokens``: more could never be drawn, so the request is a mistake, said before any work.
    Flags that would change nothing are refused too: a ``--temperature`` given (other than 0, greedy),
    ``--top-k`` or ``--top-p`` with beam search (it ranks by log-probability and draws nothing), a
    ``--length-penalty`` other than 1 without it, ``--top-k`` or ``--top-p`` with greedy decoding. A
    ``--temperature`` not given becomes the command's default (``args._temperature_default``) here.

    Raises:
        TxlError: the first setting out of range, naming the flags as ``--help`` shows them (both flags and
            their values when ``--min-new-tokens`` is the larger).
    """
    named = lambda field: flag_name(args, field)  # noqa: E731 - messages name the flags
    given_temperature = args.temperature is not None
    if not given_temperature:  # the command's default, from here on
        args.temperature = args._temperature_default
    check_sampling(args.temperature, args.top_k, args.top_p, named)
    check_decoding(args.repetition_penalty, args.no_repeat_ngram_size, args.min_new_tokens, args.length_penalty, named)
    check_range(args, 0, "max_new_tokens")
    if "" in args.stop:
        raise TxlError("--stop must be a text of at least one character, got ''")
    if args.num_beams > 1:
        given = {"temperature": given_temperature and args.temperature != 0, "top_k": args.top_k is not None,
                 "top_p": args.top_p is not None}
        for field in (field for field, on in given.items() if on):
            raise TxlError(f"{flag_name(args, field)} has no effect with {flag_name(args, 'num_beams')} "
                           f"{args.num_beams}: beam search ranks by log-probability and draws nothing; leave one out")
    elif args.length_penalty != 1.0:
        raise TxlError(f"{flag_name(args, 'length_penalty')} ranks the beams of beam search: give "
                       f"{flag_name(args, 'num_beams')} N (N > 1) too, or leave it out")
    elif args.temperature == 0:
        for field in (field for field in ("top_k", "top_p") if getattr(args, field) is not None):
            if not given_temperature:  # the command decodes greedily unless told to sample
                raise TxlError(f"{flag_name(args, field)} applies to sampling, and this command decodes greedily by "
                               f"default: give {flag_name(args, 'temperature')} T (T > 0) too, or leave it out")
            raise TxlError(f"{flag_name(args, field)} has no effect with {flag_name(args, 'temperature')} 0: greedy "
                           "decoding takes the most likely token; leave one out")
    least, most = args.min_new_tokens, args.max_new_tokens
    if least is not None and most is not None and least > most:
        raise TxlError(f"{flag_name(args, 'min_new_tokens')} {least} is more than {flag_name(args, 'max_new_tokens')} "
                       f"{most}, the most tokens drawn; lower {flag_name(args, 'min_new_tokens')} or raise "
                       f"{flag_name(args, 'max_new_tokens')}")


def check_line_keys(obj: dict, known: tuple[str, ...], where: str, advice: str = "") -> None:
    """Refuse the keys of a JSON Lines object that a command does not read, as config files and the server do
    (a misspelt key would otherwise be ignored without a word).

    Args:
        where: the line, as every per-line message names it (``p.jsonl line 3``).
        advice: added after the list of known keys.

    Raises:
        TxlError: ``{where}: unknown key(s) 'bogus' (did you mean ...?); known keys: prompt{advice}``.
    """
    from txl.config import did_you_mean

    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise TxlError(f"{where}: unknown key(s) {listed(map(quoted, unknown))}{did_you_mean(unknown[0], known)}; "
                       f"known keys: {', '.join(known)}{advice}")
