"""Fine-tuning a document classifier through the shared training loop, and measuring it (accuracy, macro-F1)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from txl.classification.model import TransformerXLForSequenceClassification
from txl.config import CLASSIFIER_NAME, SAVED_WITHOUT, DataConfig, EvalConfig, RunConfig, TrainConfig
from txl.errors import TxlError
from txl.evaluation.intervals import accuracy, macro_f1
from txl.fileio.model_files import check_trainable
from txl.fileio.model_files import read_model_config
from txl.runtime import resolve_device
from txl_recipes.classify.config import check_classification_run
from txl_recipes.classify.task import LM_PART, ClassifyTask


@dataclass
class FitResult:
    """Outcome of :func:`fit_classifier`.

    Attributes:
        model: the trained classifier (the run's final checkpoint, ``best/``), in eval mode.
        run_dir: the run folder (``run.json``, ``metrics.csv``, ``best/``, ``last/``).
        steps: optimizer steps taken (earlier sessions of a resumed run included).
        documents: documents read in training (steps x batch size).
        tokens: real (unpadded) tokens read in training (at most ``tgt_len`` per document in "first"
            and "last" mode).
        wall_s: seconds of training (earlier sessions of a resumed run included).
        final_loss: mean cross-entropy (nats) of the held-out documents at the end.
        final_accuracy: their accuracy.
    """

    model: TransformerXLForSequenceClassification
    run_dir: Path
    steps: int
    documents: int
    tokens: int
    wall_s: float
    final_loss: float
    final_accuracy: float


def classifier_run(lm_dir: str | Path, out_dir: str | Path, *, steps: int, batch_size: int, lr: float,
                   warmup_steps: int = 0, weight_decay: float = 0.0, clip: float = 1.0, seed: int = 0,
                   tgt_len: int | None = None, mem_len: int | None = None, dtype: str = "float32",
                   device: str = "auto", threads: int = 0, data: str | Path = "", save_interval: int = 0) -> RunConfig:
    """The :class:`~txl.config.RunConfig` of a classifier fine-tuned from ``lm_dir``.

    The model is the language model's config with ``tgt_len``/``mem_len`` for reading (None: the LM's);
    AdamW at ``lr`` with linear warm-up and cosine decay to lr/10; one validation, at the end
    (``eval_interval = steps``); ``last/`` also every ``save_interval`` steps (0: only at the end);
    ``data`` is recorded in ``run.json`` (the documents' source).

    Raises:
        TxlError: a missing or broken language-model config, impossible settings.
    """
    lm = read_model_config(lm_dir)
    reading = lm.span.replace(tgt_len=tgt_len, mem_len=mem_len)  # checked: TxlError
    model = dataclasses.replace(lm, tgt_len=reading.tgt_len, mem_len=reading.mem_len)
    train = TrainConfig(out_dir=str(out_dir), batch_size=batch_size, max_steps=steps, lr=lr, min_lr=lr / 10,
                        warmup_steps=warmup_steps, weight_decay=weight_decay, clip=clip, eval_interval=steps,
                        log_interval=10, seed=seed, device=device, threads=threads, dtype=dtype, sample_tokens=0,
                        save_interval=save_interval)
    run = RunConfig(model=model, data=DataConfig(path=str(data)) if data else DataConfig(), train=train,
                    eval=EvalConfig())
    run.check()
    return run


# how a run is carried out, not what it trains: a resumed run may change these
# (the documents themselves are checked by their fingerprint: data.path only records where they came from)
_HOW = {"train.out_dir", "train.threads", "train.device", "train.save_interval", "train.log_interval", "data.path"}


def _flat(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same_labels(saved, now) -> bool:
    """Whether a run's saved labels are those of ``now``: equal, or ``saved`` holds the texts of ``now``'s
    labels (a run whose integer labels were stored as strings resumes with them)."""
    return isinstance(saved, list) and all(isinstance(x, str) for x in saved) and saved == [str(x) for x in now]


def check_same_settings(run_dir: Path, run: RunConfig, classifier, task: ClassifyTask | None = None,
                        allow_data_change: bool = False) -> None:
    """Refuse to resume the classification run in ``run_dir`` with other settings than it started with
    (its ``run.json`` and ``last/classifier.json``): another number of steps, learning rate, batch size,
    reading span or classifier would make the resumed run something neither setting describes (and a
    changed number of steps would let ``best/`` be chosen on the held-out documents). With ``task``, its
    language model too: weights other than those the run started from (the checkpoint the run resumes
    from records their sha256) are refused unless ``allow_data_change`` (the training loop then warns);
    a run that recorded none sets ``task.lm_digest`` to None (nothing to compare).

    Raises:
        TxlError: naming the first settings that differ (the run folder is left as it was).
    """
    from txl.fileio import read_json_object
    from txl.training.checkpoint import RUN_NAME

    if not (run_dir / RUN_NAME).is_file():
        return  # nothing to resume: the training loop says so
    check_classification_run(run_dir)
    saved = _flat(read_json_object(run_dir / RUN_NAME))
    now = _flat(run.to_dict())
    changed = [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
               if k not in _HOW and not k.startswith("model.vocab_size") and saved.get(k) != now.get(k)]
    last = run_dir / "last" / CLASSIFIER_NAME
    if last.is_file():
        old = {**SAVED_WITHOUT, **{k: v for k, v in read_json_object(last).items() if k != "extra"}}
        changed += [f"classifier.{k} {old.get(k)!r} -> {v!r}" for k, v in classifier.to_dict().items()
                    if old.get(k) != v and not (k == "labels" and _same_labels(old.get(k), v))]
    if changed:
        shown = "; ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise TxlError(f"{run_dir} was trained with other settings ({shown}); resume it with the settings it "
                       "started with")
    if task is not None:
        _check_same_lm(run_dir, task, allow_data_change)


def _check_same_lm(run_dir: Path, task: ClassifyTask, allow: bool) -> None:
    """The language-model part of :func:`check_same_settings`, against the checkpoint the training loop
    resumes from (``last/``, else an older intact ``last.<step>/``)."""
    from txl.config import STATE_NAME
    from txl.fileio import read_json_object
    from txl.training.checkpoint_files import TRAINER_JSON, checkpoint_candidates, first_good_checkpoint
    from txl.training.fingerprint import FLAG, STATE_KEY, describe_changes

    try:
        checkpoint = first_good_checkpoint(checkpoint_candidates(run_dir), TRAINER_JSON, warn=lambda _: None)
    except TxlError:
        return  # nothing to resume from: the training loop says why
    state = checkpoint / STATE_NAME
    saved = read_json_object(state).get(STATE_KEY) if state.is_file() else None
    saved = saved.get(LM_PART) if isinstance(saved, dict) else None
    if saved is None:
        task.lm_digest = None
    elif saved != task.lm_digest and not allow:
        change = describe_changes({LM_PART: saved}, {LM_PART: task.lm_digest})[0]
        raise TxlError(f"{run_dir} started from other language-model weights than {task.lm_dir} ({change}); "
                       f"resume it with the checkpoint it started from, or add {FLAG} to continue anyway")


def fit_classifier(lm_dir: str | Path, classifier, train: tuple, valid: tuple, *, out_dir: str | Path,
                   steps: int, batch_size: int, lr: float, warmup_steps: int = 0, weight_decay: float = 0.0,
                   clip: float = 1.0, seed: int = 0, tgt_len: int | None = None, mem_len: int | None = None,
                   dtype: str = "float32", device: str = "auto", threads: int = 0, data: str | Path = "",
                   save_interval: int = 0, resume: bool = False, allow_data_change: bool = False,
                   progress: bool = False, inputs: Sequence = (),
                   log: Callable[[str], None] | None = None) -> FitResult:
    """Fine-tune a classifier (body and head) from the language model ``lm_dir`` with the shared training
    loop (:func:`txl.training.loop.train`, task :class:`~txl_recipes.classify.task.ClassifyTask`): checkpoints
    in ``out_dir``, exact resume (``resume=True``, the same arguments again), several processes under
    torchrun, mixed precision (``dtype``), Ctrl-C writes ``last/``.

    Weight decay follows :func:`txl.training.optim.parameter_groups` (linear maps only). Documents are
    cut to ``classifier.max_tokens``.

    Args:
        lm_dir: the language model (a checkpoint folder, or a run folder: its ``best/``).
        classifier: the :class:`~txl.config.ClassifierConfig`.
        train, valid: ``(documents, labels)``: token-id arrays (int64 [n_i], n_i >= 1) in the language
            model's vocabulary, and class indices; ``valid`` is read once, at the end (nothing is selected
            on it).
        out_dir: a new or empty folder for the run (or the run's folder, with ``resume``).
        save_interval: write ``last/`` (the trainer state a resume starts from) every this many steps
            (0: at the end, and on Ctrl-C).
        allow_data_change: with ``resume``, continue on documents that differ from the run's (one warning).
        data, inputs: where the documents came from (recorded in ``run.json``), and more paths the run
            reads (e.g. a held-out file): ``out_dir`` may not be inside any of them or ``lm_dir``.
        log: the training log's lines (default: stderr).

    Returns:
        :class:`FitResult`.

    Raises:
        TxlError: no documents, mismatched lengths, steps/batch_size < 1, as
            :func:`txl.training.loop.train` (a folder in use or holding another run, ...).
    """
    from txl.training.checkpoint import load_checkpoint
    from txl.training.loop import train as train_loop

    if steps < 1 or batch_size < 1:
        raise TxlError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    lm = load_checkpoint(lm_dir)  # the language model's checks: checksums, vocabulary, not a classifier
    lm_dir = lm.path
    check_trainable(lm.model.state_dict(), str(lm_dir))  # before the run folder is claimed
    task = ClassifyTask(lm_dir, classifier, lm.tokenizer, train, valid)
    task.inputs = [lm_dir, *inputs]
    run = classifier_run(lm_dir, out_dir, steps=steps, batch_size=batch_size, lr=lr, warmup_steps=warmup_steps,
                         weight_decay=weight_decay, clip=clip, seed=seed, tgt_len=tgt_len, mem_len=mem_len,
                         dtype=dtype, device=device, threads=threads, data=data, save_interval=save_interval)
    if resume:
        check_same_settings(Path(out_dir), run, classifier, task, allow_data_change)
    result = train_loop(run, progress=progress, log=log, resume=resume, task=task, allow_data_change=allow_data_change)
    model = task.load_model(result.best_dir, resolve_device(device))
    one_window = classifier.mode in ("first", "last")
    tokens = 0
    for i in task.batches(run, "cpu").order.take(0, result.steps * batch_size):  # the documents read, in order
        doc = train[0][i]
        length = min(len(doc), classifier.max_tokens or len(doc))
        tokens += min(length, run.model.tgt_len) if one_window else length
    return FitResult(model=model, run_dir=result.run_dir, steps=result.steps, documents=result.steps * batch_size,
                     tokens=tokens, wall_s=result.wall_s, final_loss=result.final.loss,
                     final_accuracy=result.final.settings["accuracy"])


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


__all__ = ["FitResult", "classification_metrics", "classifier_run", "fit_classifier", "predict_labels"]
