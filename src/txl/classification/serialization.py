"""Saving and loading document classifiers: safetensors weights + JSON configs, nothing unpickled."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import save_file

from txl.config import CLASSIFIER_NAME, CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME
from txl.data import load_tokenizer
from txl.errors import TxlError
from txl.fileio import atomic_write, read_json_object, write_json
from txl.model.serialization import load_weights, read_model_config, unique_state


def save_classifier(model, directory: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Write ``model.safetensors``, ``config.json``, ``classifier.json`` (+ ``vocab.json``) into ``directory``.

    The files go to ``directory.tmp`` first; the folder is swapped in only once complete, so a crash
    leaves any previous checkpoint intact. ``extra`` (JSON-able) is stored under ``"extra"`` in
    ``classifier.json`` (e.g. training settings and held-out metrics).

    Raises:
        TxlError: ``directory`` exists and is neither empty nor a classifier checkpoint (it is never
            replaced then); the write failed (disk full, permissions).
    """
    directory = Path(directory)
    if directory.exists() and (not directory.is_dir() or (any(directory.iterdir())
                                                           and not (directory / CLASSIFIER_NAME).is_file())):
        raise TxlError(f"{directory} exists and is not a classifier checkpoint; choose a new folder")
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in unique_state(model).items()}
        atomic_write(tmp / WEIGHTS_NAME, lambda path: save_file(tensors, path, metadata={"format": "pt"}))
        write_json(tmp / CONFIG_NAME, model.config.to_dict())
        write_json(tmp / CLASSIFIER_NAME, {**model.classifier.to_dict(), "extra": extra or {}})
        if model.tokenizer is not None:
            model.tokenizer.save(tmp / VOCAB_NAME)
    except (OSError, SafetensorError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TxlError(f"could not write the classifier to {directory}: {getattr(err, 'strerror', None) or err}") from None
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def read_classifier(directory: str | Path) -> tuple[Any, dict[str, Any]]:
    """The model config and the ``classifier.json`` values (without ``extra``) of a classifier folder.

    Returns:
        ``(TransformerXLConfig, dict)``: the body's config and the classifier settings to build from.

    Raises:
        TxlError: the folder is missing or is not a classifier checkpoint (e.g. a language-model
            checkpoint), or invalid JSON.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise TxlError(f"classifier checkpoint {directory} " + ("is a file, not a folder" if directory.exists()
                                                                  else "does not exist"))
    if not (directory / CLASSIFIER_NAME).is_file():
        raise TxlError(f"{directory} is not a txl classifier checkpoint (no {CLASSIFIER_NAME}); "
                       "give the folder written by `txl classify train --out`")
    values = read_json_object(directory / CLASSIFIER_NAME)
    values.pop("extra", None)
    return read_model_config(directory), values


def load_classifier_weights(model, directory: str | Path, map_location: str = "cpu") -> None:
    """Load the weights and (when present) the vocabulary of a classifier folder into ``model``.

    Raises:
        TxlError: weights that do not match the configs, or a vocabulary of the wrong size.
    """
    directory = Path(directory)
    load_weights(model, directory, map_location, f"{CONFIG_NAME} and {CLASSIFIER_NAME}")
    if (directory / VOCAB_NAME).is_file():
        model.tokenizer = load_tokenizer(directory / VOCAB_NAME)
        if model.tokenizer.vocab_size != model.config.vocab_size:
            raise TxlError(f"{directory / VOCAB_NAME} has {model.tokenizer.vocab_size} tokens but the model "
                           f"expects {model.config.vocab_size}")
