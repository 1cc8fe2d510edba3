"""A saved model's files: safetensors weights + JSON config, written and read. Nothing is ever unpickled."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from txl.errors import TxlError
from txl.fileio import atomic_write, read_json_object, write_json
from txl.config import CONFIG_NAME, RUN_NAME, VOCAB_NAME, WEIGHTS_NAME, TransformerXLConfig

SCALE_SUFFIX = ".weight_scale"  # an int8 layer's scales beside its int8 weight (txl.kernels.int8)
_ON_ATTENTION = re.compile(r"^(|.*\.)(layers\.\d+\.attn\.)(r_net\.|r_w_bias$|r_r_bias$|r_emb$)")


def current_name(name: str) -> str:
    """A weight's name in this layout: checkpoints written with a layer's position parameters directly on
    its attention (``layers.3.attn.r_net.weight``, ``...attn.r_w_bias``, ``...attn.r_emb``) load with them
    under the attention's position scheme (``layers.3.attn.pos.r_net.weight``); other names are kept."""
    return _ON_ATTENTION.sub(r"\1\2pos.\3", name)


def save_model(model: torch.nn.Module, directory: str | Path, tokenizer: Any = None,
               config: TransformerXLConfig | None = None) -> None:
    """Write ``model.safetensors``, ``config.json`` and, with a tokenizer, ``vocab.json`` into ``directory``.

    ``config`` (default ``model.config``) is what ``config.json`` records: training stores the span
    of its current schedule phase there (same shapes, another ``tgt_len``/``mem_len``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # a tied parameter is stored once, under its first name; loading re-ties it by construction
    tensors = {k: v.detach().contiguous().cpu() for k, v in unique_state(model).items()}
    atomic_write(directory / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_json(directory / CONFIG_NAME, (config or model.config).to_dict())
    if tokenizer is not None:
        tokenizer.save(directory / VOCAB_NAME)


def unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the second names of tied parameters (e.g. the softmax weight tied to the
    embedding), so that safetensors stores each tensor once."""
    keep = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    return {k: v for k, v in model.state_dict().items() if k in keep}


def read_model_config(directory: str | Path) -> TransformerXLConfig:
    """Read ``config.json`` of a saved model.

    Raises:
        TxlError: missing directory or file, invalid JSON, a Hugging Face TransfoXL config (to be
            converted first), unknown keys or bad values.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise TxlError(f"checkpoint directory {directory} " + ("is a file, not a folder" if directory.exists()
                                                              else "does not exist"))
    path = directory / CONFIG_NAME
    if not path.is_file():
        if (directory / RUN_NAME).is_file():  # a training run: its checkpoints are the folders inside it
            raise TxlError(f"{directory} is a run folder, not a checkpoint: give {directory / 'best'} (or last), or "
                           f"load it with txl.load_checkpoint({str(directory)!r})")
        raise TxlError(f"{directory} has no {CONFIG_NAME}: not a txl checkpoint (expected {CONFIG_NAME} and {WEIGHTS_NAME})")
    values = read_json_object(path)
    if values.get("model_type") == "transfo-xl":  # transformers' TransfoXL: converted, not read as it is
        raise TxlError(f"{directory} is a Hugging Face TransfoXL folder; convert it first: txl convert hf {directory} "
                       "DST")
    try:
        return TransformerXLConfig.from_dict(values)
    except TxlError as err:
        raise TxlError(err.args[0] if str(path) in str(err) else f"{path}: {err}") from None


def weight_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """The tensor names (in this layout, :func:`current_name`) and shapes in the header of
    ``directory/model.safetensors`` (reading nothing else).

    Raises:
        TxlError: no or unreadable weights.
    """
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise TxlError(f"{directory} has no {WEIGHTS_NAME}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {current_name(key): tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise TxlError(f"cannot read weights {path}: {err}") from None


def check_weights_header(model: torch.nn.Module, directory: Path, described_by: str,
                         shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Compare the tensor names and shapes in the header of ``directory/model.safetensors`` (``shapes``:
    :func:`weight_shapes` already read) with ``model``'s (typically built on the meta device).

    Raises:
        TxlError: no or unreadable weights, or names/shapes that differ from ``described_by``.
    """
    shapes = weight_shapes(directory) if shapes is None else shapes
    _compare(shapes, {k: tuple(v.shape) for k, v in unique_state(model).items()}, directory / WEIGHTS_NAME,
             described_by)


def _compare(found: dict[str, tuple], expected: dict[str, tuple], path: Path, described_by: str) -> None:
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if unexpected and not int8_names(expected):  # int8 weights where a float model is built (to be trained)
        check_trainable(unexpected, str(path.parent))
    if missing or unexpected:
        raise TxlError(f"weights in {path} do not match {described_by}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key, shape in found.items():
        if shape != expected[key]:
            raise TxlError(f"weights in {path} do not match {described_by}: {key} has shape {shape}, "
                           f"config implies {expected[key]}")


def load_weights(model: torch.nn.Module, directory: Path, map_location, described_by: str) -> None:
    """Load ``directory/model.safetensors`` into ``model``, refusing missing, unexpected or
    wrongly shaped tensors (tied parameters are stored once and filled by the ties).

    Raises:
        TxlError: no or unreadable weights, weights that do not match ``described_by`` (the
            config file(s) the model was built from), or tensors that are not floating point or hold
            NaN/infinity.
    """
    path = directory / WEIGHTS_NAME
    if not path.is_file():
        raise TxlError(f"{directory} has no {WEIGHTS_NAME}")
    try:
        tensors = {current_name(k): v for k, v in load_file(str(path), device=str(map_location)).items()}
    except (SafetensorError, OSError, ValueError) as err:
        raise TxlError(f"cannot read weights {path}: {err}") from None
    expected = unique_state(model)
    _compare({k: tuple(v.shape) for k, v in tensors.items()}, {k: tuple(v.shape) for k, v in expected.items()},
             path, described_by)
    for key, value in tensors.items():
        if expected[key].dtype == torch.int8:  # an int8 layer's weight (txl.kernels.int8)
            if value.dtype != torch.int8:
                raise TxlError(f"weights in {path} are broken: {key} has dtype {value.dtype}, not int8")
            continue
        if not value.is_floating_point():
            raise TxlError(f"weights in {path} are broken: {key} has dtype {value.dtype}, not a floating-point type")
        if not bool(torch.isfinite(value).all()):
            raise TxlError(f"weights in {path} are broken: {key} holds NaN or infinite values (e.g. saved from a "
                           "diverged run); use an earlier checkpoint")
    model.load_state_dict(tensors, strict=False)


def int8_names(tensor_names: Iterable[str]) -> list[str]:
    """The layers whose weights are int8 in a saved model, from its tensor names (``<layer>.weight_scale``)."""
    return sorted(n[: -len(SCALE_SUFFIX)] for n in tensor_names if n.endswith(SCALE_SUFFIX))


def check_trainable(tensor_names: Iterable[str], where: str) -> None:
    """Refuse int8 weights where a model is to be trained (fine-tuning, a classifier, dynamic evaluation).

    Raises:
        TxlError: ``tensor_names`` (of the weights at ``where``) include an int8 layer's scales.
    """
    if int8_names(tensor_names):
        raise TxlError(f"{where} holds int8 weights, which are for inference only and cannot be trained; use "
                       "the float checkpoint it was made from")
