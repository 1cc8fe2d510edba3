"""File input and output shared by every layer (the bottom layer, beside :mod:`txl.errors`), one module
per concern:

- :mod:`txl.fileio.writes`: atomic file writes (a reader never sees a half-written file, and a failed
  write leaves the old one): :func:`atomic_write`, :func:`write_json`.
- :mod:`txl.fileio.json_files`: the JSON / JSON Lines readers of every command, whose only exception is
  :class:`~txl.errors.TxlError` (:func:`read_json`, :func:`read_json_object`, :func:`read_jsonl`), plus
  :func:`read_bytes`, :func:`sha256_file`, :func:`oserrors_as` (an ``OSError`` as a one-line TxlError),
  :func:`path_inside` for file names read from such files and :func:`json_kind` for messages about a field's
  type.
- :mod:`txl.fileio.toml_files`: :func:`read_toml`, the reader of every TOML config file.
- :mod:`txl.fileio.guards`: the two guards every command uses before it writes: :func:`claim_folder`
  (one process per output folder) and :func:`check_output_path` (never over an input, never into a
  checkpoint or run folder, never over an existing file without ``--force``, only into an existing folder
  that takes new files).
- :mod:`txl.fileio.model_files`: a saved model's ``model.safetensors`` and ``config.json``, written and read
  with every check (:func:`~txl.fileio.model_files.save_model`, :func:`~txl.fileio.model_files.read_model_config`,
  :func:`~txl.fileio.model_files.load_weights`), and the names of
  int8 weights in them. It needs torch and safetensors, so it is imported from its own path only.

The names the other layers use are importable from ``txl.fileio`` itself.
"""

from txl.fileio.guards import (LOCK_SUFFIX, FolderClaim, check_output_folder, check_output_path, claim_folder,
                               continue_command, is_protected_folder, refuse_nonempty_folder, run_kind)
from txl.fileio.json_files import (json_kind, oserrors_as, path_inside, read_bytes, read_json, read_json_object,
                                   read_jsonl, sha256_file)
from txl.fileio.toml_files import read_toml
from txl.fileio.writes import atomic_write, write_json

__all__ = ["LOCK_SUFFIX", "FolderClaim", "atomic_write", "check_output_folder", "check_output_path", "claim_folder",
           "continue_command", "is_protected_folder", "json_kind", "oserrors_as", "path_inside", "read_bytes",
           "read_json", "read_json_object", "read_jsonl", "read_toml", "refuse_nonempty_folder", "run_kind",
           "sha256_file", "write_json"]
