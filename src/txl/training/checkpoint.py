"""Run directories and checkpoints.

A run directory holds ``run.json`` (the resolved config), ``metrics.csv`` and two checkpoints,
``best/`` (lowest validation loss) and ``last/``. A checkpoint directory holds ``model.safetensors``,
``config.json`` (model), ``vocab.json``, ``run.json`` and ``state.json`` (step, metrics). A checkpoint
is written into a temporary sibling directory and then swapped in, so a crash mid-write leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from txl.config import RunConfig
from txl.data import Tokenizer, load_tokenizer
from txl.errors import TxlError
from txl.fileio import read_json_object as _read_json
from txl.fileio import write_json
from txl.model import TransformerXLLM
from txl.model.serialization import CONFIG_NAME, VOCAB_NAME

RUN_NAME = "run.json"
STATE_NAME = "state.json"


def save_checkpoint(directory: str | Path, model: TransformerXLLM, tokenizer: Tokenizer, run: RunConfig,
                    state: dict[str, Any], extra: Callable[[Path], None] | None = None) -> None:
    """Write a complete checkpoint into ``directory``, replacing any previous one only once complete.

    ``extra(folder)`` may write more files (e.g. the trainer state) into the folder before the swap.
    """
    directory = Path(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, tokenizer)
    write_json(tmp / RUN_NAME, run.to_dict())
    write_json(tmp / STATE_NAME, state)
    if extra is not None:
        extra(tmp)
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model, its tokenizer, the run config and the saved state."""

    model: TransformerXLLM
    tokenizer: Tokenizer
    run: RunConfig
    state: dict[str, Any]
    path: Path
    has_run_config: bool = True

    def score(self, texts: list[str], **options: Any) -> list:
        """Score ``texts`` (one document each) with this model and tokenizer.

        The attention span and batch size default to the run's ``eval`` section, as in ``txl eval``;
        ``options`` override them (see :func:`txl.scoring.score_tokens`). Returns a list of
        :class:`txl.scoring.DocumentScore` (log-probabilities in nats).
        """
        from txl.scoring import score_texts

        e = self.run.eval
        defaults = {"batch_size": e.batch_size, "tgt_len": e.tgt_len, "mem_len": e.mem_len,
                    "clamp_len": e.clamp_len, "same_length": e.same_length}
        return score_texts(self.model, self.tokenizer, texts, **{**defaults, **options})


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """Accept a checkpoint directory or a run directory (then its ``best/``, else ``last/``).

    Raises:
        TxlError: nothing that looks like a checkpoint there.
    """
    path = Path(path)
    if not path.exists():
        raise TxlError(f"checkpoint {path} does not exist")
    if (path / CONFIG_NAME).is_file():
        return path
    for name in ("best", "last", "best.old", "last.old"):
        if (path / name / CONFIG_NAME).is_file():
            return path / name
    raise TxlError(f"{path} is not a txl checkpoint or run directory: no {CONFIG_NAME} in it or in best/ or last/")


def load_checkpoint(path: str | Path, map_location: str = "cpu") -> Checkpoint:
    """Load model (in eval mode), tokenizer, run config and state (safetensors + JSON only).

    Raises:
        TxlError: missing files, invalid JSON, a vocabulary whose size differs from the model's.
    """
    directory = resolve_checkpoint_dir(path)
    model = TransformerXLLM.from_pretrained(directory, map_location=map_location)
    if not (directory / VOCAB_NAME).is_file():
        raise TxlError(f"{directory} has no {VOCAB_NAME}: cannot decode or encode text for this model")
    tokenizer = load_tokenizer(directory / VOCAB_NAME)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise TxlError(f"{directory / VOCAB_NAME} has {tokenizer.vocab_size} tokens but the model expects "
                       f"{model.config.vocab_size}: the vocabulary does not belong to this checkpoint")
    has_run = (directory / RUN_NAME).is_file()
    run = RunConfig.from_dict(_read_json(directory / RUN_NAME)) if has_run else RunConfig()
    run.model = model.config
    state = _read_json(directory / STATE_NAME) if (directory / STATE_NAME).is_file() else {}
    return Checkpoint(model=model, tokenizer=tokenizer, run=run, state=state, path=directory, has_run_config=has_run)



