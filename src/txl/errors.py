"""User-facing errors.

Every problem a user can cause (bad config, missing corpus, mismatched checkpoint, ...) is raised
as :class:`TxlError` with a one-line message that names the problem and what to do. The CLI turns
it into ``txl: error: <message>`` on stderr and a non-zero exit, without a traceback.
"""


class TxlError(ValueError):
    """A problem with the user's input (config, data, checkpoint), reported as one clear line.

    Subclasses :class:`ValueError`, so library callers may catch either.
    """
