"""The TOML reader of every config file (``txl train --config``, ``txl finetune --config``, ``txl classify
train --config``), whose only exception is :class:`~txl.errors.TxlError`."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


def read_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """The tables of the TOML file ``path`` (``tomllib``: TOML 1.0), as nested dicts.

    Raises:
        TxlError: the file is missing or not a file, unreadable, not UTF-8, or not valid TOML
            (``config file PATH is not valid TOML: reason``), or nested past Python's recursion limit.
    """
    from txl.errors import TxlError

    path = Path(path)
    if not path.is_file():
        raise TxlError(f"{what} {path} " + ("is not a file" if path.exists() else "does not exist"))
    try:
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))  # (a leading byte-order mark, as JSON files)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise TxlError(f"{what} {path} is not valid TOML: {err}") from None
    except RecursionError:
        raise TxlError(f"{what} {path} is not valid TOML for txl: nested too deeply") from None
    except OSError as err:
        raise TxlError(f"cannot read {what} {path}: {err.strerror or err}") from None
