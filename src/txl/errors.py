"""User-facing errors.

Every problem a user can cause (bad config, missing corpus, mismatched checkpoint, ...) is raised
as :class:`TxlError` with a one-line message that names the problem and what to do. The CLI turns
it into ``txl: error: <message>`` on stderr and a non-zero exit, without a traceback.
"""


class TxlError(ValueError):
    """A problem with the user's input (config, data, checkpoint), reported as one clear line.

    Subclasses :class:`ValueError`, so library callers may catch either.
    """


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun in the number it takes, for messages: ``counted(1, "character")`` is
    ``"1 character"``, ``counted(2, "character")`` is ``"2 characters"`` (``plural`` for irregular nouns:
    ``counted(3, "entry", "entries")``). ``n`` is shown with thousands separators (``"13,733 tokens"``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
