"""Fine-tuning a document classifier and measuring it (accuracy, macro-F1)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from txl.classification.data import pad_batch
from txl.errors import TxlError
from txl.evaluation.intervals import accuracy, macro_f1
from txl.training.optim import make_optimizer
from txl.training.schedules import learning_rate


@dataclass
class FitResult:
    """Outcome of :func:`fit_classifier`.

    Attributes:
        steps: optimizer steps taken.
        documents: documents read in training (steps x batch size).
        tokens: real (unpadded) tokens read in training (at most tgt_len per document in "first" and
            "last" mode).
        wall_s: seconds of training.
        final_loss: mean cross-entropy (nats) over the last 10 steps.
    """

    steps: int
    documents: int
    tokens: int
    wall_s: float
    final_loss: float


def fit_classifier(model, docs: Sequence[np.ndarray], labels: Sequence[int], *, steps: int, batch_size: int,
                   lr: float, warmup_steps: int = 0, weight_decay: float = 0.0, clip: float = 1.0,
                   seed: int = 0, log: Callable[[int, float], None] | None = None) -> FitResult:
    """Fine-tune ``model`` (body and head) with AdamW on cross-entropy, in shuffled epochs of batches.

    Weight decay follows :func:`txl.training.optim.parameter_groups` (linear maps only).

    The learning rate warms up linearly over ``warmup_steps`` then decays with a cosine to lr/10.
    Documents are cut to ``model.classifier.max_tokens``. ``log(step, loss)`` is called every step.

    Args:
        docs: token-id arrays (int64 [n_i], n_i >= 1), one per document.
        labels: class index of each document.

    Returns:
        :class:`FitResult`.

    Raises:
        TxlError: no documents, mismatched lengths, or steps/batch_size < 1.
    """
    if not docs or len(docs) != len(labels):
        raise TxlError(f"need one label per document, got {len(docs)} documents and {len(labels)} labels")
    if steps < 1 or batch_size < 1:
        raise TxlError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    device = next(model.parameters()).device
    opt = make_optimizer(model, lr, weight_decay)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)  # dropout draws depend on the global generator: seed it too
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    order: list[int] = []
    max_tokens = model.classifier.max_tokens
    labels_t = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    losses, n_docs, n_tokens = [], 0, 0
    model.train()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order += rng.permutation(len(docs)).tolist()
        chunk, order = order[:batch_size], order[batch_size:]
        ids, lengths = pad_batch([docs[i] for i in chunk], max_tokens)
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, lr=lr, min_lr=lr / 10, warmup_steps=warmup_steps, max_steps=steps)
        out = model(ids.to(device), lengths.to(device), labels_t[chunk].to(device))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(float(out.loss.detach()))
        n_docs += len(chunk)
        one_window = model.classifier.mode in ("first", "last")
        n_tokens += int((lengths.clamp(max=model.config.tgt_len) if one_window else lengths).sum())
        if log is not None:
            log(step, losses[-1])
    model.eval()
    return FitResult(steps=steps, documents=n_docs, tokens=n_tokens, wall_s=time.perf_counter() - start,
                     final_loss=float(np.mean(losses[-10:])))


@torch.no_grad()
def predict_labels(model, docs: Sequence[np.ndarray], batch_size: int = 8) -> np.ndarray:
    """Class probabilities float32 [N, num_labels] for token-id documents (eval mode, no dropout)."""
    return model.predict_proba(list(docs), batch_size=batch_size).numpy()


def classification_metrics(y_true: Sequence[int], y_pred: Sequence[int], num_labels: int) -> dict:
    """Accuracy and macro-F1 (both in [0, 1]) with per-class precision/recall/F1.

    Accuracy and macro-F1 are :func:`txl.evaluation.intervals.accuracy` and
    :func:`~txl.evaluation.intervals.macro_f1` (the unweighted mean of the per-class F1 over classes that
    occur in ``y_true`` or ``y_pred``: a class with no support and no prediction is left out, as
    scikit-learn does).

    Returns:
        ``{"accuracy", "macro_f1", "n", "per_class": [{"precision", "recall", "f1", "support"}, ...],
        "confusion": [[count true i predicted j]]}``.
    """
    y_true, y_pred = np.asarray(y_true, dtype=np.int64), np.asarray(y_pred, dtype=np.int64)
    if y_true.size == 0 or y_true.shape != y_pred.shape:
        raise TxlError("metrics need the same, non-zero number of true and predicted labels")
    confusion = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(confusion, (y_true, y_pred), 1)
    per_class = []
    for c in range(num_labels):
        tp = confusion[c, c]
        predicted, support = confusion[:, c].sum(), confusion[c, :].sum()
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class.append({"precision": float(precision), "recall": float(recall), "f1": float(f1),
                          "support": int(support)})
    return {"accuracy": accuracy(y_true, y_pred), "macro_f1": macro_f1(y_true, y_pred, num_labels),
            "n": int(y_true.size), "per_class": per_class, "confusion": confusion.tolist()}


def evaluate_classifier(model, docs: Sequence[np.ndarray], labels: Sequence[int], batch_size: int = 8) -> dict:
    """:func:`classification_metrics` of ``model``'s most probable class on labelled documents."""
    probs = predict_labels(model, docs, batch_size)
    return classification_metrics(labels, probs.argmax(1), model.classifier.num_labels)


__all__ = ["FitResult", "classification_metrics", "evaluate_classifier", "fit_classifier",
           "predict_labels"]
