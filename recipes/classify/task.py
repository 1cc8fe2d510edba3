"""Document classification as a task of the shared training loop (:func:`txl.training.loop.train`).

The loop gives classification what it gives language modelling and fine-tuning: ``last/`` and
``best/`` checkpoints with rotation, exact resume (``resume=True``: optimizer, RNG and data position),
several processes (torchrun: DistributedDataParallel over the objective), mixed precision
(``train.dtype``), gradient accumulation, a stop on Ctrl-C that writes ``last/``, ``metrics.csv``.

- The model is a :class:`~txl.classification.model.TransformerXLForSequenceClassification`; a new run
  starts its body from a language-model checkpoint (:meth:`ClassifyTask.init_weights`). Its softmax
  is not used: its own parameters (those not tied to the embedding) are frozen.
- A step reads ``batch_size`` documents in seeded shuffled epochs (epoch e is ``randperm(n, seed +
  e)``, so a resumed run reads exactly the documents it would have read). Rows are right-padded with
  -1 (the objective recovers each document's length from them).
- The loss of a step is the mean cross-entropy (nats) over its documents; the unit is "nats" (per
  document), and what the loop counts as targets (``metrics.csv``'s ``tokens``, the bar's rate) are
  documents. Validation (``train.eval_interval``) reads the held-out documents and reports their
  mean cross-entropy and accuracy; with ``eval_interval = max_steps`` (what ``txl classify train``
  sets) the only validation is at the end, so ``best/`` is the final model and nothing is selected
  on the held-out documents.

A checkpoint holds ``model.safetensors`` (body and head), ``config.json`` (the body), ``classifier.json``
(labels and settings) and the language model's ``vocab.json``: the folder
:meth:`TransformerXLForSequenceClassification.from_pretrained` reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from txl.classification.data import pad_batch
from txl.classification.model import TransformerXLForSequenceClassification
from txl.config import CHECKSUMS_NAME, CLASSIFIER_NAME, WEIGHTS_NAME
from txl.data.iterators import EpochBatches, to_device
from txl.errors import TxlError
from txl.evaluation.stream import EvalResult
from txl.fileio import read_json_object, write_json
from txl.model import LMOutput
from txl.fileio.model_files import load_weights
from txl.training.fingerprint import file_digest
from txl_recipes.classify.probe import probe_head

UNIT = "nats"  # the loss of a document: cross-entropy in nats
LM_PART = "language model"  # the fingerprint's part for the weights a run started from


def weights_digest(folder: Path) -> dict:
    """``{"bytes": N, "sha256": HEX}`` of a checkpoint's ``model.safetensors``: the sha256 its
    ``checksums.json`` lists (checked when the checkpoint was loaded), else computed."""
    sums = folder / CHECKSUMS_NAME
    listed = read_json_object(sums).get(WEIGHTS_NAME) if sums.is_file() else None
    if isinstance(listed, str):
        return {"bytes": (folder / WEIGHTS_NAME).stat().st_size, "sha256": listed}
    return file_digest(folder / WEIGHTS_NAME)


def padded(docs: Sequence[np.ndarray], max_tokens: int | None) -> torch.Tensor:
    """int64 [B, L] right-padded with -1 (L = the longest document, cut to ``max_tokens``)."""
    ids, lengths = pad_batch(docs, max_tokens)
    cols = torch.arange(ids.size(1))[None, :]
    return ids.masked_fill(cols >= lengths[:, None], -1)


class ClassifyObjective(nn.Module):
    """The classification loss as a module (so that DistributedDataParallel can wrap it).

    ``forward(x, mems=None, labels=y, span=None)``: ``x`` int64 [b, L] documents right-padded with -1,
    ``y`` int64 [b] class indices; returns an :class:`~txl.model.LMOutput` whose ``token_loss`` is float
    [b], each document's cross-entropy (nats), and ``mems`` None (a document carries no memory into
    the next step).
    """

    def __init__(self, classifier: TransformerXLForSequenceClassification) -> None:
        super().__init__()
        self.classifier = classifier

    @property
    def config(self):
        """The body's config (the optimizer step reads it as it reads a bare model's)."""
        return self.classifier.config

    def forward(self, x: torch.Tensor, mems=None, labels: torch.Tensor | None = None, span=None) -> LMOutput:
        lengths = (x >= 0).sum(1)
        out = self.classifier(x.clamp(min=0), lengths)
        token_loss = None
        if labels is not None:
            token_loss = F.cross_entropy(out.logits.to(torch.promote_types(out.logits.dtype, torch.float32)), labels,
                                         reduction="none")
        return LMOutput(logits=out.logits, loss=None, mems=None, token_loss=token_loss)


class ClassifyTask:
    """Fine-tuning a document classifier from a language model (see the module doc).

    Args:
        lm_dir: the language-model checkpoint folder a new run starts its body from.
        classifier: the :class:`~txl.config.ClassifierConfig` (labels, mode, pooling,
            ``grad_segments``, dropout, ``max_tokens``).
        tokenizer: the language model's tokenizer.
        train, valid: ``(documents, labels)``: token-id arrays (int64 [n_i], n_i >= 1) and class indices.

    Raises:
        TxlError: no training or held-out documents, a document without tokens, ids outside the
            vocabulary, labels outside ``[0, num_labels)`` or of another count than the documents.
    """

    unit = UNIT

    def __init__(self, lm_dir: str | Path, classifier, tokenizer, train: tuple, valid: tuple) -> None:
        for name, (docs, labels) in (("training", train), ("held-out", valid)):
            if not docs or len(docs) != len(labels):
                raise TxlError(f"need {name} documents with one label each, got {len(docs)} documents and "
                               f"{len(labels)} labels")
            if min(len(d) for d in docs) < 1:
                raise TxlError(f"a {name} document has no tokens")
            if any(d.min() < 0 or d.max() >= tokenizer.vocab_size for d in docs):
                raise TxlError(f"a {name} document holds ids outside the vocabulary [0, {tokenizer.vocab_size})")
            if min(labels) < 0 or max(labels) >= classifier.num_labels:
                raise TxlError(f"{name} labels must be class indices in [0, {classifier.num_labels})")
        self.lm_dir = Path(lm_dir)
        self.lm_digest: dict | None = weights_digest(self.lm_dir)  # None: a resumed run that recorded none
        self.classifier = classifier
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.docs = {"train": list(train[0]), "valid": list(valid[0])}
        self.labels = {"train": [int(y) for y in train[1]], "valid": [int(y) for y in valid[1]]}

    def describe(self) -> str:
        tokens = sum(len(d) for d in self.docs["train"])
        c = self.classifier
        return (f"data: {len(self.docs['train'])} training documents ({tokens:,} tokens), {len(self.docs['valid'])} "
                f"held-out; {c.num_labels} labels; mode {c.mode}, pooling {c.pooling}, grad_segments "
                f"{c.grad_segments or 'all'}, passes {c.passes}, recurrence {c.recurrence}, head from "
                f"{'a linear probe' if c.head_init == 'probe' else 'random'}; from {self.lm_dir}")

    def check(self, run, spans) -> None:
        """Nothing more to check: every document is read whole, whatever the span."""

    def build_model(self, run) -> TransformerXLForSequenceClassification:
        """The classifier (its head seeded by the run's seed); the body's own softmax parameters frozen."""
        model = TransformerXLForSequenceClassification(run.model, classifier=self.classifier)
        model.tokenizer = self.tokenizer
        tied = {id(p) for p in model.body.word_emb.parameters()}
        for p in model.body.crit.parameters():
            if id(p) not in tied:
                p.requires_grad_(False)
        return model

    def init_weights(self, model: TransformerXLForSequenceClassification) -> None:
        """A new run's body starts from the language model; its head from a linear probe over the training
        documents (``head_init="probe"``: :func:`~txl_recipes.classify.probe.probe_head`, one reading of them)
        or from the seeded initialisation (``"random"``)."""
        load_weights(model.body, self.lm_dir, next(model.parameters()).device, f"{self.lm_dir}")
        if self.classifier.head_init == "probe":
            probe_head(model, self.docs["train"], self.labels["train"])

    def checkpoint_files(self, folder: Path, model: TransformerXLForSequenceClassification) -> None:
        """``classifier.json`` beside the weights (the checkpoint is a classifier folder)."""
        write_json(folder / CLASSIFIER_NAME, {**model.classifier.to_dict(), "extra": {}})

    def load_model(self, folder: Path, device) -> TransformerXLForSequenceClassification:
        """A checkpoint of this task, in evaluation mode."""
        return TransformerXLForSequenceClassification.from_pretrained(folder, map_location=str(device))

    def fingerprint(self) -> dict:
        """The token count and sha256 of the documents and labels of each split, and the size and sha256 of
        the language model's weights (``lm_digest``)."""
        out: dict = {} if self.lm_digest is None else {LM_PART: self.lm_digest}
        for name, docs in self.docs.items():
            h = hashlib.sha256()
            for doc, label in zip(docs, self.labels[name]):
                h.update(np.int64(label).tobytes() + np.int64(len(doc)).tobytes()
                         + np.ascontiguousarray(doc, dtype=np.int64).tobytes())
            out[f"{name} documents"] = {"tokens": sum(len(d) for d in docs), "sha256": h.hexdigest()}
        return out

    def batches(self, run, device) -> EpochBatches:
        """``batch_size`` documents per step in seeded shuffled epochs; the position counts documents taken."""
        docs, labels = self.docs["train"], torch.as_tensor(np.asarray(self.labels["train"], dtype=np.int64))

        def make(chosen: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            x = padded([docs[i] for i in chosen], self.classifier.max_tokens)
            return to_device(x, device), to_device(labels[chosen], device)
        return EpochBatches(len(docs), run.train.batch_size, run.train.seed, make)

    def objective(self, model: TransformerXLForSequenceClassification) -> ClassifyObjective:
        return ClassifyObjective(model)

    @torch.no_grad()
    def validate(self, model, run, span, dist) -> EvalResult:
        """Mean cross-entropy (nats) and accuracy over the held-out documents (every rank reads them all)."""
        model.eval()
        probs = model.predict_proba(self.docs["valid"], batch_size=run.eval.batch_size)
        labels = torch.as_tensor(self.labels["valid"])
        loss = float(-probs.clamp(min=1e-30).log()[torch.arange(len(labels)), labels].double().mean())
        accuracy = float((probs.argmax(1) == labels).double().mean())
        return EvalResult(loss=loss, n_tokens=len(labels), unit=UNIT,
                          settings={"documents": len(labels), "accuracy": round(accuracy, 6)})

    def final(self, model, run, dist, progress: bool = False) -> EvalResult:
        """The same as :meth:`validate`."""
        return self.validate(model, run, None, dist)

    def sample(self, model, run) -> tuple[str, str]:
        """No sample: a classifier writes no text."""
        return "", ""
