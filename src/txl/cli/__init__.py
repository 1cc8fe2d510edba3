"""The ``txl`` command line: one registry of subcommands, one grammar (see docs/cli.md).

Each command is a module of this package exposing ``NAME``, ``HELP`` (one line), ``EXAMPLE``,
``add_arguments(parser)`` and ``run(args) -> int``; a command group (``txl convert hf|...``)
exposes ``NAME``, ``HELP``, ``EXAMPLE`` and ``SUBCOMMANDS``, a tuple of
:class:`~txl.cli.common.Command` with the same attributes. The shared flags live in
:mod:`txl.cli.common`.

Other installed packages add commands through the entry-point group ``txl.commands``: an entry named
``bench`` is a command (a module as above), one named ``data.docstrings`` a subcommand of the group
``data`` (a :class:`~txl.cli.common.Command`). The recipes (``txl_recipes``, the repository's
``recipes/`` folder) add ``classify``, ``export``, ``plot``, ``serve``, ``summarize`` and ``data prepare``
this way, and the studies (``txl_studies``, ``studies/``) ``bench``, ``ablate``, ``recl``, ``data
docstrings`` and ``data packages``; both are installed with txl, and the library never imports them.

Every user error is printed as one line ``txl: error: ...`` on stderr with exit status 2; an
interrupted run exits with 130 (training saves its ``last/`` checkpoint first).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
import textwrap

from txl.cli.checks import check_shared_flags
from txl.cli.common import interrupted_by, interrupts_held_while_importing, print_notes, visible_flags
from txl.errors import TxlError, UsageParser, clip_message, listed

# torch and numpy are imported inside the commands, so that Ctrl-C during start-up or a usage
# error never needs them and never shows a traceback

COMMAND_MODULES: tuple[str, ...] = (
    "txl.cli.train", "txl.cli.finetune", "txl.cli.eval", "txl.cli.generate", "txl.cli.score", "txl.cli.convert",
    "txl.cli.data",
)
PLUGIN_GROUP = "txl.commands"  # entry points of other installed packages: "NAME" or "GROUP.NAME"


@functools.cache
def plugin_commands() -> dict[str, object]:
    """The commands other installed packages add, by entry-point name (``"bench"``, ``"data.docstrings"``),
    grouped by the package that adds them (``txl_recipes`` before ``txl_studies``), by name within each.

    A plug-in that fails to import is left out with one warning line on stderr; the other commands
    keep working.
    """
    from importlib.metadata import entry_points

    found = {}
    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: (p.value.partition(".")[0], p.name)):
        try:
            found[point.name] = point.load()
        except Exception as err:  # noqa: BLE001 - a broken plug-in must not take txl down
            print(f"txl: warning: command {point.name!r} ({point.value}) could not be loaded: "
                  f"{type(err).__name__}: {_first_line(err)}", file=sys.stderr)
    return found


def command_modules() -> list:
    """The registered command modules, in the order ``txl --help`` lists them: txl's own, then the
    plug-ins' top-level commands in :func:`plugin_commands`' order."""
    own = [importlib.import_module(name) for name in COMMAND_MODULES]
    names = {module.NAME for module in own}
    return own + [spec for key, spec in plugin_commands().items() if "." not in key and spec.NAME not in names]


def subcommands(spec, path: tuple[str, ...] = ()) -> tuple:
    """The subcommands of the group ``spec`` (at ``path`` below ``txl``): its own ``SUBCOMMANDS`` (a group
    may have none of its own), then those plug-ins add under ``GROUP.NAME`` entry points; ``()`` for a
    command that is not a group."""
    own = getattr(spec, "SUBCOMMANDS", None)
    if own is None:
        return ()
    own = tuple(own)
    prefix = ".".join(path + (spec.NAME,)) + "."
    names = {child.NAME for child in own}
    return own + tuple(child for key, child in plugin_commands().items()
                       if key.startswith(prefix) and "." not in key[len(prefix):] and child.NAME not in names)


def _add_command(subparsers, spec, path: tuple[str, ...]) -> None:
    """Add ``spec`` (a command module or :class:`~txl.cli.common.Command`) and, for a group, its subcommands."""
    description = spec.HELP[:1].upper() + spec.HELP[1:] + "."
    details = getattr(spec, "DETAILS", "")
    if details:
        description += "\n\n" + textwrap.fill(details, width=100)
    p = subparsers.add_parser(spec.NAME, help=spec.HELP, description=description,
                              epilog=f"Example:\n  {spec.EXAMPLE}", formatter_class=argparse.RawDescriptionHelpFormatter)
    children = subcommands(spec, path)
    if hasattr(spec, "SUBCOMMANDS") and not children:  # a group whose plug-ins are all missing
        p.add_argument("_rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        p.set_defaults(_run=functools.partial(_no_subcommands, " ".join(("txl",) + path + (spec.NAME,))), _flags=(),
                       _prog=p.prog)
    elif children:
        sub = p.add_subparsers(dest="_".join(path + (spec.NAME, "command")), required=True, metavar="COMMAND")
        for child in children:
            _add_command(sub, child, path + (spec.NAME,))
    else:
        spec.add_arguments(p)
        # _prog: the command whose --help a usage error found after parsing names
        p.set_defaults(_run=spec.run, _flags=visible_flags(p), _prog=p.prog)


def _no_subcommands(group: str, args: argparse.Namespace) -> int:
    """What a group with no subcommands installed does: refuse, naming the reinstall that registers them."""
    raise TxlError(f"no {group} subcommands are installed: in the txl folder, run .venv/bin/python -m pip install "
                   "-e . (it registers the commands of recipes/ and studies/)")


def build_parser() -> argparse.ArgumentParser:
    """The ``txl`` parser with every registered command (imports no torch)."""
    from txl import __version__

    parser = UsageParser(prog="txl", description="Transformer-XL: train, evaluate and sample language models with "
                     "segment-level memory.", epilog="Example:\n  txl train --tokenizer char --out runs/demo\n\n"
                     "Run `txl COMMAND --help` for the flags of a command; docs/cli.md describes the grammar.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in command_modules():
        _add_command(sub, module, ())
    return parser


def all_parsers(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Every parser of the command line by its program name (``"txl classify train"``), the root included."""
    parser = parser or build_parser()
    found = {parser.prog: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.update(all_parsers(child))
    return found


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``txl`` console script; returns the exit status.

    SIGINT ends any command with exit status 130 and the one line ``txl: interrupted``
    (:func:`~txl.cli.common.interrupted_by`; ``train`` writes ``last/`` first through its own handler), even
    when the process was started with SIGINT ignored: a shell that starts a command in the background without
    job control (``txl generate ... &`` in a script) sets SIGINT to ignored, and Python then keeps it ignored,
    so that ``kill -INT`` or Ctrl-C would do nothing; the default handler is installed whatever was inherited,
    and the inherited one restored after. A command run in a process that had imported torch before leaves
    its CPU thread count (``--threads``) as it found it.
    """
    with interrupted_by(signal.SIGINT), interrupts_held_while_importing("torch"):
        torch = sys.modules.get("torch")  # run in a process that uses torch already (tests, a notebook): its
        threads = torch.get_num_threads() if torch is not None else None  # thread count is given back after
        try:
            return _main(argv)
        finally:
            if threads is not None and torch.get_num_threads() != threads:
                torch.set_num_threads(threads)


def _main(argv: list[str] | None) -> int:
    """:func:`main` without the signal set-up."""
    try:
        parser = build_parser()
        try:
            args, extra = parser.parse_known_args(argv)
            # argparse fills a list positional from one run of arguments only; the rest of the list, placed
            # after an option (`txl score CKPT --out F b.txt`, `txl train --tokenizer char a=1`), comes back
            # here and joins the list the command names in ``_more``
            more = getattr(args, "_more", None)
            unknown = [e for e in extra if e.startswith("-") or more is None]
            if unknown:  # said by the command's own parser: `(see: txl eval --help)`
                command = all_parsers(parser).get(getattr(args, "_prog", None), parser)
                command.error(f"unrecognized arguments: {listed(unknown, sep=' ')}")
        except SystemExit as exit_:  # usage errors (one line already printed), --help, --version
            return int(exit_.code or 0)
        if extra:
            setattr(args, more, getattr(args, more) + extra)
        args._argv = argv
        check_shared_flags(args)  # --threads, span flags and --seed of any command, before torch is imported
        code = args._run(args)
        print_notes(args)  # a command that loaded a checkpoint but never said so
        return code
    except TxlError as err:
        if os.environ.get("RANK", "0") == "0":  # torchrun: every rank meets the same error; rank 0 reports it
            # an input quoted in the message is cut to about 100 characters, whichever check wrote it
            print(f"txl: error: {clip_message(str(err), inputs=argv or sys.argv[1:])}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":
            print("txl: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        print(f"txl: error: {clip_message(f'{err.strerror or err}{where}', inputs=argv or sys.argv[1:])}",
              file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as err:  # an allocation no check foresaw: one line, not a traceback
        from txl.runtime import out_of_memory

        if _compile_failure(err):
            cause = getattr(err, "inner_exception", None) or err  # a backend's failure wraps the real one
            hint = " (inductor needs a C++ compiler on a CPU: docs/compile.md)" if "_inductor" in type(
                cause).__module__ or type(err).__name__ == "BackendCompilerFailed" else ""
            print(f"txl: error: torch.compile failed ({type(cause).__name__}: {_first_line(cause)}){hint}; run "
                  "without --compile / train.compile", file=sys.stderr)
            return 1
        if not out_of_memory(err):
            raise
        print("txl: error: out of memory: the machine could not hold what this command needed; use a smaller "
              "batch, --tgt-len, --mem-len or text (files already written are untouched)", file=sys.stderr)
        return 1


def _compile_failure(err: BaseException) -> bool:
    """Whether ``err`` comes from ``torch.compile`` (dynamo tracing or a backend's build), not from txl:
    its type is one of ``torch._dynamo``'s or ``torch._inductor``'s. Only ``--compile`` and
    ``train.compile`` run the compiler, so no other command meets one."""
    return type(err).__module__.startswith(("torch._dynamo", "torch._inductor"))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "no message"


if __name__ == "__main__":
    sys.exit(main())
