"""The settings of ``txl classify train``: one dataclass, checked as every configuration of txl is; and
which run folder it may resume."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from txl.config import CONFIG_NAME, HEAD_INITS, MODES, POOLINGS, RECURRENCES, RUN_NAME, check_choice, check_seed
from txl.errors import TxlError
from txl.fileio import continue_command, run_kind


def check_classification_run(run_dir: str | Path) -> None:
    """Refuse to resume ``run_dir`` when it holds another kind of txl run (torch-free): a run folder whose
    checkpoints hold no ``classifier.json``. A run with no checkpoint yet passes (the training loop says
    there is nothing to resume).

    Raises:
        TxlError: naming the kind of run and the command that continues it.
    """
    run_dir = Path(run_dir)
    started = any((run_dir / name / CONFIG_NAME).is_file() for name in ("last", "best"))
    if (run_dir / RUN_NAME).is_file() and started and run_kind(run_dir) != "classifier":
        raise TxlError(f"{run_dir} is a {run_kind(run_dir)} run, not a document-classification run; continue it "
                       f"with {continue_command(run_dir)}")


@dataclass
class ClassifyTrainConfig:
    """The settings of ``txl classify train`` that a ``--config`` file's ``[classify]`` table may give (each
    also a flag of the same name: a flag wins over the file, the file over these defaults). None: decided
    later -- ``mode`` from the model (memory, or first for ``attn_type="abs"``), ``tgt_len`` and ``mem_len``
    from the language model, ``valid_fraction`` 0.2 when no ``--valid`` file is given. The classifier's
    reading (``mode`` ... ``head_init``) is :class:`~txl.config.ClassifierConfig`'s; the rest is the fine-tuning's:
    ``steps`` of ``batch_size`` documents at ``lr`` (``warmup_steps`` of linear warm-up), ``weight_decay``,
    gradient-norm ``clip``, the head's ``dropout``, ``max_tokens`` per document (0: whole), a checkpoint
    every ``save_interval`` steps, ``seed``.
    """

    mode: str | None = None
    pooling: str = "document"
    grad_segments: int = 1
    passes: int = 1
    recurrence: str = "previous_layer"
    head_init: str = "probe"
    tgt_len: int | None = None
    mem_len: int | None = None
    max_tokens: int = 0
    steps: int = 200
    batch_size: int = 8
    lr: float = 3e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    clip: float = 1.0
    dropout: float = 0.1
    valid_fraction: float | None = None
    save_interval: int = 50
    seed: int = 0

    def check(self, name: Callable[[str], str] = str) -> "ClassifyTrainConfig":
        """Each setting within its range or choices; returns itself. ``name(field)`` is how a message names
        a setting: the field itself by default, the flag or the config file's key for a command.

        Raises:
            TxlError: the first setting out of range, named by ``name``.
        """
        def refuse(field: str, rule: str) -> None:
            value = getattr(self, field)
            raise TxlError(f"{name(field)} must be {rule}, got {value:g}" if isinstance(value, float)
                           else f"{name(field)} must be {rule}, got {value!r}")

        choices = {"mode": MODES + (None,), "pooling": POOLINGS, "passes": (1, 2), "recurrence": RECURRENCES,
                   "head_init": HEAD_INITS}
        for field, allowed in choices.items():
            check_choice(getattr(self, field), allowed, name(field))
        lowest = {"steps": 1, "batch_size": 1, "tgt_len": 1, "grad_segments": 0, "max_tokens": 0, "warmup_steps": 0,
                  "save_interval": 0, "mem_len": 0, "weight_decay": 0, "clip": 0}
        for field, low in lowest.items():
            if getattr(self, field) is not None and getattr(self, field) < low:
                refuse(field, f">= {low}")
        if not 0 < self.lr < float("inf"):
            refuse("lr", "a finite number > 0")
        check_seed(self.seed, name("seed"))
        if not 0 <= self.dropout < 1:
            refuse("dropout", "in [0, 1)")
        if self.valid_fraction is not None and not 0 < self.valid_fraction < 1:
            refuse("valid_fraction", "in (0, 1)")
        return self
