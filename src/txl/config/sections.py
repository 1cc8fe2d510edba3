"""The data, training, evaluation and fine-tuning sections of a run config (:class:`txl.config.RunConfig`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from txl.config.fields import (DTYPES, NORMALIZE, TOKENIZERS, check_choice, check_fields, check_minimums, check_seed,
                               check_split, check_threads)
from txl.errors import TxlError


@dataclass
class DataConfig:
    """Where the text comes from and how it is tokenised.

    Attributes:
        path: a text file or a directory of files (all files matching ``pattern``, sorted); None means
            the built-in default corpus (this Python's standard-library ``*.py`` modules).
        tokenizer: "byte" (vocab 256), "char" (vocab from the corpus), "word" (WikiText style) or
            "bpe" (byte-level BPE trained on the train split, ``max_size`` tokens); None means the
            tokenizer a prepared dataset folder recommends (its ``dataset.json``), else "byte".
        train, valid, test: separate split files; when given, ``path`` and ``split`` are not used.
        split: train/valid/test fractions of one corpus (contiguous, in order).
        split_by: how ``split`` cuts a folder: "text" (the files' concatenation, at the fractions; word
            and BPE at the nearest line start) or "file" (whole files, in order: no file in two splits).
        pattern: glob for files inside a directory ``path``.
        min_freq, max_size, lower: word vocabulary options (``max_size`` is the BPE vocabulary size).
        normalize: "none", or "wikitext" to tokenise raw text the WikiText way (``1 @,@ 000``) first.
        cache_dir: where encoded corpora are cached (None: ``~/.cache/txl``).
        workers: processes that encode a word or BPE corpus into the cache (1: this one).
    """

    path: str | None = None
    tokenizer: str | None = None
    train: str | None = None
    valid: str | None = None
    test: str | None = None
    split: list[float] = field(default_factory=lambda: [0.9, 0.05, 0.05])
    split_by: str = "text"
    pattern: str = "*"
    min_freq: int = 1
    max_size: int | None = None
    lower: bool = False
    normalize: str = "none"
    cache_dir: str | None = None
    workers: int = 1

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "data")
        check_choice(self.normalize, NORMALIZE, "data.normalize")
        check_choice(self.split_by, SPLIT_BY, "data.split_by")
        if not 1 <= self.workers <= 256:
            raise TxlError(f"data.workers must be from 1 to 256, got {self.workers}")
        check_choice(self.tokenizer, (*TOKENIZERS, None), "data.tokenizer")
        check_split(self.split, "data.split")
        check_minimums(self, {"min_freq": 1}, "data.")


LOGGERS = ("tensorboard",)  # the values of train.log (--log)
SPLIT_BY = ("text", "file")  # the values of data.split_by


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping of a training run.

    Attributes:
        out_dir: run directory (config, metrics.csv, ``best/`` and ``last/`` checkpoints).
        batch_size: parallel streams per step (the global batch: split over torchrun ranks).
        grad_accum_steps: each rank's streams are run in this many pieces per step, gradients
            accumulated (the reference's ``batch_chunk``): same update, less activation memory.
        max_steps: optimizer steps.
        lr, min_lr: peak and final learning rate (AdamW; linear warm-up then cosine decay).
        warmup_steps: steps of linear warm-up from 0 to ``lr``.
        weight_decay: AdamW decoupled weight decay on linear maps only (see txl.training.optim: not on
            biases, LayerNorm gains, u/v, Shaw tables, embeddings or output tables).
        clip: max global gradient norm (0 disables).
        tgt_len_schedule: progressive segment length, ``[[step, tgt_len], ...]`` or
            ``[[step, tgt_len, mem_len], ...]``; from each step on that length is used; with pairs,
            mem_len follows tgt_len. Empty: ``model.tgt_len``/``model.mem_len`` throughout.
        varlen: variable-length segments around tgt_len (reference's varlen iterator).
        eval_interval: steps between validations (with memory, at the training span).
        eval_max_tokens: tokens of the valid split used by periodic validation (0: all).
        log_interval: steps between metric rows.
        seed: seeds python, numpy and torch.
        device: "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
        threads: CPU threads for torch's operations in each process (``--threads``); 0: automatic,
            ``OMP_NUM_THREADS`` when set, else the CPUs this process may use less the busy ones
            (the load average), at least 1 (see :func:`txl.runtime.choose_threads`).
        dtype: "float32", or "bfloat16"/"float16" autocast.
        max_bad_steps: a step whose loss is NaN or inf is skipped (no update, fresh memory) and
            counted; this many in a row stop the run with a message.
        sample_tokens: tokens sampled at the end of training (0: none).
        sample_prompt: prompt for that sample ("": the first tokens of the valid split).
        save_interval: steps between ``last/`` checkpoints (0: at each validation only; every
            validation also writes one).
        keep_last: ``last`` checkpoints kept (``last/``, then ``last.<step>/``): a corrupt newest one
            falls back to the one before.
        deterministic: ``torch.use_deterministic_algorithms(True)`` (bit-identical reruns on GPU too,
            at some speed cost; CPU runs are deterministic at a given thread count).
        compile: run the training forward and backward through ``torch.compile`` (the language
            model traces as one graph, no break; the first steps of each segment shape pay the
            compilation). The same updates as eager up to float rounding; dropout draws its masks
            from the compiler's own generator, so a run with dropout is not the eager run's twin.
            docs/compile.md.
        log: where the metric rows go besides ``metrics.csv``: ``"tensorboard"``, event files under
            ``out_dir/tensorboard/`` (needs the tensorboard package: the ``log`` extra).
    """

    out_dir: str = "runs/default"
    batch_size: int = 16
    max_steps: int = 700
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup_steps: int = 50
    weight_decay: float = 0.0
    clip: float = 0.25
    tgt_len_schedule: list[list[int]] = field(default_factory=list)
    varlen: bool = False
    eval_interval: int = 100
    eval_max_tokens: int = 32768
    log_interval: int = 10
    seed: int = 1234
    device: str = "auto"
    threads: int = 0
    dtype: str = "float32"
    max_bad_steps: int = 10
    sample_tokens: int = 300
    sample_prompt: str = ""
    grad_accum_steps: int = 1
    save_interval: int = 0
    keep_last: int = 2
    deterministic: bool = False
    compile: bool = False
    log: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "train")
        if not self.out_dir.strip():
            raise TxlError("train.out_dir must name a folder, got an empty name")
        unknown = [name for name in self.log if name not in LOGGERS]
        if unknown or len(set(self.log)) != len(self.log):
            raise TxlError(f"train.log takes each of {', '.join(LOGGERS)} at most once, got {self.log!r}")
        check_minimums(self, dict.fromkeys(("batch_size", "max_steps", "eval_interval", "log_interval", "max_bad_steps",
                                            "grad_accum_steps", "keep_last"), 1), "train.")
        check_seed(self.seed, "train.seed")
        if not math.isfinite(self.lr) or not math.isfinite(self.clip) or not math.isfinite(self.weight_decay):
            raise TxlError("train.lr, train.clip and train.weight_decay must be finite numbers")
        if not self.lr > 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise TxlError(f"train.lr must be > 0 and 0 <= train.min_lr <= train.lr, got lr={self.lr}, min_lr={self.min_lr}")
        check_minimums(self, dict.fromkeys(("warmup_steps", "eval_max_tokens", "sample_tokens", "save_interval"), 0),
                       "train.")
        if self.clip < 0 or self.weight_decay < 0:
            raise TxlError("train.clip and train.weight_decay must be >= 0")
        check_choice(self.dtype, DTYPES, "train.dtype")
        check_threads(self.threads, "train.threads")
        last = -1
        for entry in self.tgt_len_schedule:
            if len(entry) not in (2, 3) or entry[0] < 0 or any(v < 1 for v in entry[1:2]) or \
                    (len(entry) == 3 and entry[2] < 0):
                raise TxlError(f"train.tgt_len_schedule entries must be [step, tgt_len] or [step, tgt_len, mem_len] "
                               f"with step >= 0, tgt_len >= 1, mem_len >= 0; got {entry}")
            if entry[0] <= last:
                raise TxlError(f"train.tgt_len_schedule steps must increase, got {self.tgt_len_schedule}")
            last = entry[0]


@dataclass
class EvalConfig:
    """Evaluation settings, independent of training (the paper evaluates with a far longer memory).

    Attributes:
        split: "valid" or "test".
        batch_size: parallel streams.
        tgt_len, mem_len, clamp_len, same_length, cmem_len: attention span for evaluation (None: the
            model's; ``cmem_len``, the compressed-memory slots, needs a model trained with one).
        warmup: feed ``mem_len`` tokens before the first scored one so every scored token sees a full
            memory (those context tokens are not scored).
        max_tokens: score at most this many tokens (0: the whole split).
    """

    split: str = "valid"
    batch_size: int = 8
    tgt_len: int | None = None
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None
    cmem_len: int | None = None
    warmup: bool = False
    max_tokens: int = 0

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "eval")
        if self.split not in ("valid", "test"):
            raise TxlError(f"eval.split must be 'valid' or 'test', got {self.split!r}")
        check_minimums(self, {"batch_size": 1, "tgt_len": 1, "mem_len": 0, "cmem_len": 0, "clamp_len": 0,
                              "max_tokens": 0}, "eval.", {"clamp_len": " (0: no clamping)"})


@dataclass
class FinetuneConfig:
    """The ``[finetune]`` section: a run that fine-tunes a language model on prompt/completion pairs
    (``txl finetune``, :mod:`txl.training.finetune`) instead of training one on a corpus.

    Attributes:
        init: the language-model checkpoint (or run directory: its best/) the weights start from.
        grad_segments: K >= 1: gradients flow through the last K segments of each example (and
            always through every segment holding completion tokens); earlier segments are read
            without autograd and the memory entering the window is detached (truncated
            back-propagation through time, as ``txl classify --grad-segments``). 0: all segments.
        max_prompt_tokens: keep only the last N tokens of each prompt (0: whole prompts).
    """

    init: str = ""
    grad_segments: int = 1
    max_prompt_tokens: int = 0

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first value of a wrong type or impossible."""
        check_fields(type(self), dataclasses.asdict(self), "finetune")
        if not self.init:
            raise TxlError("finetune.init must name the language-model checkpoint to start from (--init)")
        check_minimums(self, {"grad_segments": 0, "max_prompt_tokens": 0}, "finetune.",
                       {"grad_segments": " (0: all segments)", "max_prompt_tokens": " (0: whole prompts)"})
