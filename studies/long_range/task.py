"""A training task on given examples whose loss counts only at their answers: the retrieval suite's trainer.

:class:`ExampleTask` is a task of the training loop (see :mod:`txl.training.lm_task` for the
interface) for examples that are already token rows: each row ``(ids, start)`` is read from an empty
memory, segment by segment with the memory carried (paper §3.2), and scored on ``ids[start:]`` only,
exactly as fine-tuning reads prompt/completion pairs (:class:`txl.training.finetune.PairsTask`,
whose batches, objective and evaluation it uses): ``batch_size`` examples per step in seeded
shuffled epochs, gradients through the last ``grad_segments`` segments of each example and every
segment holding a scored token (truncated back-propagation through time; 1 is the paper's
stop-gradient memory, 0 all segments).

It is what :mod:`txl_studies.long_range.suite` trains its retrieval models with: an example is a fact,
filler and a question, its answer the scored part. Unlike pairs, the rows need no markers and no
language model to start from: a new model starts from its seeded initialisation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from txl.errors import TxlError
from txl.evaluation.completions import evaluate_completions
from txl.evaluation.stream import EvalResult, metric_unit
from txl.model import TransformerXLLM
from txl.config import resolve_span, RunConfig
from txl.training.finetune import CompletionRowsTask

__all__ = ["ExampleTask"]

Rows = Sequence[tuple[np.ndarray, int]]


class ExampleTask(CompletionRowsTask):
    """Training on the examples ``train`` (loss on each row's ``ids[start:]``), validation on ``valid``.

    Args:
        train, valid: rows ``(ids, start)``: int64 [n] token ids and the index of the first scored
            token (1 <= start < n).
        tokenizer: the tokenizer of the ids (its ``kind`` gives the unit).
        grad_segments: segments of each example with back-propagation (0: all; see the module docstring).
        dtype: "float32" or an autocast dtype for the forward passes.
        description: the "data: ..." line of the training log.

    Raises:
        TxlError: no rows, a row without a scored token, ids outside the vocabulary, ``grad_segments`` < 0.
    """

    def __init__(self, train: Rows, valid: Rows, tokenizer, *, grad_segments: int = 1, dtype: str = "float32",
                 description: str = "") -> None:
        for name, rows in (("train", train), ("valid", valid)):
            if not rows:
                raise TxlError(f"the {name} examples are empty")
            for ids, start in rows:
                if not 1 <= start < len(ids):
                    raise TxlError(f"a {name} example of {len(ids)} tokens scores from {start}: nothing to score")
                if ids.min() < 0 or ids.max() >= tokenizer.vocab_size:
                    raise TxlError(f"a {name} example holds ids outside the vocabulary [0, {tokenizer.vocab_size})")
        if grad_segments < 0:
            raise TxlError(f"grad_segments must be >= 0 (0: all segments), got {grad_segments}")
        self.rows = {"train": list(train), "valid": list(valid)}
        self.tokenizer = tokenizer
        self.unit = metric_unit(tokenizer.kind)
        self.vocab_size = tokenizer.vocab_size
        self.grad_segments = grad_segments or None
        self.dtype = dtype
        self.description = description

    def describe(self) -> str:
        scored = sum(len(ids) - start for ids, start in self.rows["train"])
        tokens = sum(len(ids) for ids, _ in self.rows["train"])
        return (f"data: {self.description or 'given examples'}; train/valid {len(self.rows['train'])}/"
                f"{len(self.rows['valid'])} examples, {tokens:,} tokens ({scored:,} scored) in train; grad_segments "
                f"{self.grad_segments or 'all'}")

    def check(self, run: RunConfig, spans) -> None:
        """Nothing more to check: every example is read whole, whatever the span."""

    def init_weights(self, model: TransformerXLLM) -> None:
        """A new model starts from its seeded initialisation."""

    def fingerprint(self) -> dict:
        """The sha256 of the training and validation examples."""
        out = {}
        for name, rows in self.rows.items():
            h = hashlib.sha256()
            for ids, start in rows:
                h.update(np.int64(start).tobytes() + np.ascontiguousarray(ids, dtype=np.int64).tobytes())
            out[f"{name} examples"] = {"rows": len(rows), "sha256": h.hexdigest()}
        return out

    def final(self, model: TransformerXLLM, run: RunConfig, dist, progress: bool = False) -> EvalResult:
        """The same with the ``[eval]`` span settings."""
        e = run.eval
        span = resolve_span(model.config, tgt_len=e.tgt_len, mem_len=e.mem_len, clamp_len=e.clamp_len,
                            same_length=e.same_length, cmem_len=e.cmem_len)
        return evaluate_completions(model, self.rows["valid"], span=span, unit=self.unit,
                                    batch_size=e.batch_size, dtype=run.train.dtype, dist=dist, progress=progress)

    def sample(self, model: TransformerXLLM, run: RunConfig) -> tuple[str, str]:
        """No sample: the examples are not text to continue."""
        return "", ""
