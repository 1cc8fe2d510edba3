"""User-facing errors.

Every problem a user can cause (bad config, missing corpus, mismatched checkpoint, ...) is raised
as :class:`TxlError` with a one-line message that names the problem and what to do. The CLI turns
it into ``txl: error: <message>`` on stderr and a non-zero exit, without a traceback.
"""

import argparse
import os
import re


class TxlError(ValueError):
    """A problem with the user's input (config, data, checkpoint), reported as one clear line.

    Subclasses :class:`ValueError`, so library callers may catch either.
    """


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes, for messages: ``counted(1, "character")`` is
    ``"1 character"``, ``counted(2, "character")`` is ``"2 characters"`` (``plural`` for irregular nouns:
    ``counted(3, "entry", "entries")``). ``n`` is shown with thousands separators (``"13,733 tokens"``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


CLIP_CHARS = 100  #: the most characters of one piece of user input an error message quotes


def shorten(text: str, limit: int = CLIP_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its start and end around ``…`` (``limit``
    characters in all): what a message quotes of a long input (an id, a value, a path)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    return f"{text[:head]}…{text[len(text) - (limit - 1 - head):]}"


def quoted(value: object, limit: int = CLIP_CHARS) -> str:
    """``repr(value)`` for a message, cut by :func:`shorten` when long (``limit`` characters, the quotes
    included), with the full length said: ``quoted("a" * 10**5)`` is ``'aaa…aaa' (100,000 characters)``."""
    if isinstance(value, str) and len(value) > limit - 2:  # the quotes count: the result is one stretch of limit
        return f"{shorten(value, limit - 2)!r} ({len(value):,} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{shorten(text, limit)} ({len(text):,} characters)"


def listed(items, most: int = 3, sep: str = ", ") -> str:
    """The first ``most`` of ``items`` (texts, each cut by :func:`shorten`) joined by ``sep``, then
    ``and N more``: how a message names what it refuses when there may be many (unknown keys, arguments)."""
    items = [str(item) for item in items]
    shown = sep.join(shorten(item) for item in items[:most])
    return shown + (f" and {len(items) - most:,} more" if len(items) > most else "")


def clip_message(message: str, limit: int = CLIP_CHARS, inputs=()) -> str:
    """``message`` with every quoted stretch ('...' or "...") and every stretch without whitespace that is
    longer than ``limit`` characters cut by :func:`shorten`, and so is every occurrence of one of
    ``inputs`` (what the user gave: a command's arguments) that is longer, spaces and all: the last
    guard of the command line's and the server's error lines, so that no message echoes more than about
    ``limit`` characters of an input, whichever check wrote it. What it gives is left as it is by a
    second call."""
    if len(message) <= limit:
        return message
    for given in sorted({str(x) for x in inputs if len(str(x)) > limit}, key=len, reverse=True):
        for form in dict.fromkeys((given, given.rstrip("/"), os.path.normpath(given))):
            for quote in ("'", '"', ""):  # a quoted input keeps its quotes, the length said after them
                whole = f"{quote}{form}{quote}"
                if len(form) > limit and whole in message:
                    cut = shorten(form, limit - 2 * len(quote))
                    message = message.replace(whole, f"{quote}{cut}{quote} ({len(form):,} characters)")

    def cut(match) -> str:
        text = match.group(0)
        if text[0] in "'\"" and text[-1] == text[0] and len(text) > 1:
            return f"{text[0]}{shorten(text[1:-1], limit - 2)}{text[0]} ({len(text) - 2:,} characters)"
        return f"{shorten(text, limit)} ({len(text):,} characters)"

    n = limit + 1
    # a quote opens after a non-letter and closes before one (the apostrophe of "the model's" is neither)
    return re.sub(rf"(?<!\w)'[^'\n]{{{n},}}'(?!\w)|(?<!\w)\"[^\"\n]{{{n},}}\"(?!\w)|\S{{{n},}}", cut, message)


class _StoreOnce(argparse._StoreAction):
    """argparse's ``store`` for an option that takes one value: given twice (``--config a.toml --config
    b.toml``, or two spellings of one flag) it is a usage error instead of the last value silently
    winning."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given_options", {})
        if option_string is not None and self.dest in given:
            parser.error(f"{option_string} is given twice ({given[self.dest]!r} and {values!r}); give it once")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class UsageParser(argparse.ArgumentParser):
    """argparse with usage errors reported as one ``txl: error:`` line (exit status 2): the parser of the
    ``txl`` commands and of ``python -m txl_recipes.export.runner``. An option that takes one value may
    be given once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message: str):  # noqa: D102 - argparse hook
        self.exit(2, f"txl: error: {clip_message(message)} (see: {self.prog} --help)\n")
