"""What the training loop trains on: a *task* gives it the data, the batches, the loss and the reports.

:func:`txl.training.loop.train` is one loop (run folder, checkpoints, resume, progress bar,
metrics, several processes, bad-input guarantees) driving a task:

* :class:`LMTask` (this module): language modelling on a corpus, ``txl train`` (paper §3.2): one
  segment of ``batch_size`` streams per step, the memory carried from step to step.
* :class:`txl.training.finetune.PairsTask`: prompt/completion pairs, ``txl finetune``: each step
  reads ``batch_size`` whole examples segment by segment, the loss on completion tokens only
  (:class:`txl_studies.long_range.task.ExampleTask` the same on given examples).
* :class:`txl_recipes.classify.task.ClassifyTask`: a document classifier fine-tuned from a language
  model, ``txl classify train``: each step reads ``batch_size`` whole documents.

A task has these attributes and methods (duck-typed; both classes document their own):
``tokenizer``, ``unit``, ``vocab_size``, ``describe()`` (the "data: ..." log line),
``check(run, spans)`` (sizes, before training), ``init_weights(model)`` (a new run's starting
weights), ``batches(run, device)`` (an object whose ``next(position, tgt_len, generator)`` gives
``(x, y, new_position, fresh)``: int64 [B, T] inputs and labels of the global batch, the data
position after them, and whether the memory starts afresh), ``objective(model)`` (the module the
optimizer step calls as ``module(x, mems=..., labels=y, span=...)``, returning an object with
``token_loss`` and ``mems``), ``validate(model, run, span, dist)``, ``final(model, run, dist, progress=False)``
(the :class:`~txl.evaluation.stream.EvalResult` of periodic validation and of the final report, the latter
with a progress bar on stderr when ``progress``) and
``sample(model, run)`` (``(prompt, text)`` shown at the end) and ``fingerprint()`` (the size and
sha256 of each part of the data, :mod:`txl.training.fingerprint`, recorded in every checkpoint and
compared when resuming). Three optional hooks let a task train a model other than the language
model (a classifier): ``build_model(run)`` (the module to train; default ``TransformerXLLM(run.model)``),
``checkpoint_files(folder, model)`` (more files of each checkpoint, e.g. ``classifier.json``) and
``load_model(folder, device)`` (a checkpoint of the task, for the final report; default the language
model of :func:`txl.training.checkpoint.load_checkpoint`).
"""

from __future__ import annotations

import numpy as np
import torch

from txl.data import CorpusSplits, LMOrderedIterator, LMShuffledIterator, shard_sentences
from txl.data.corpus import load_run_corpus
from txl.data.splits import SPLITS
from txl.data.iterators import sample_segment_length
from txl.errors import TxlError
from txl.evaluation.stream import EvalResult, evaluate, metric_unit
from txl.generation import generate
from txl.model import TransformerXLLM
from txl.config import RunConfig
from txl.training.fingerprint import files_digest, split_digest


def shuffled_batches(corpus: CorpusSplits, batch_size: int, tgt_len: int, device: torch.device, seed: int):
    """Endless (x, y) segments [B, tgt_len] from a shuffled-sentence corpus (lm1b), as the reference:
    each pass visits the training shards in a new seeded order, each shard's sentences shuffled and
    packed into ``batch_size`` streams (:class:`~txl.data.iterators.LMShuffledIterator`)."""
    generator = torch.Generator().manual_seed(seed)
    eos = corpus.tokenizer.eos_id
    while True:
        for k in torch.randperm(len(corpus.train_shards), generator=generator).tolist():
            sentences = shard_sentences(corpus.train_shards[k], corpus.tokenizer)
            if sentences:
                shard_seed = int(torch.randint(0, 2**31 - 1, (), generator=generator))
                yield from LMShuffledIterator(sentences, batch_size, tgt_len, eos_id=eos, seed=shard_seed, device=device)


class _OrderedBatches:
    """Consecutive segments of ``batch_size`` streams of the train split (variable length with ``varlen``)."""

    def __init__(self, corpus: CorpusSplits, run: RunConfig, device: torch.device) -> None:
        self.iterator = LMOrderedIterator(corpus.train, run.train.batch_size, run.model.tgt_len, device=device)
        self.varlen = run.train.varlen

    def next(self, position: int, tgt_len: int, generator: torch.Generator):
        fresh = False
        if position >= self.iterator.stream_len:  # a new pass over the data: fresh memory
            position, fresh = 0, True
        seq_len = sample_segment_length(tgt_len, generator) if self.varlen else tgt_len
        x, y = self.iterator.segment(position, seq_len)
        return x, y, position + x.size(1), fresh


class _ShuffledBatches:
    """Segments of streams of shuffled sentences (lm1b); the memory runs on, the position is not used."""

    def __init__(self, corpus: CorpusSplits, run: RunConfig, device: torch.device) -> None:
        self.stream = shuffled_batches(corpus, run.train.batch_size, run.model.tgt_len, device, run.train.seed)

    def next(self, position: int, tgt_len: int, generator: torch.Generator):
        x, y = next(self.stream)
        return x, y, position, False


class LMTask:
    """Language modelling on the corpus of ``run.data`` (``txl train``), see the module docstring.

    Raises:
        TxlError: the corpus cannot be loaded (see :func:`txl.data.corpus.load_run_corpus`).
    """

    def __init__(self, run: RunConfig, progress: bool = False) -> None:
        self.corpus = load_run_corpus(run.data, progress=progress)
        self.tokenizer = self.corpus.tokenizer
        self.unit = metric_unit(self.tokenizer.kind)
        self.vocab_size = self.corpus.vocab_size

    def describe(self) -> str:
        c = self.corpus
        return (f"data: {c.source}; {c.tokenizer.kind} vocabulary of {c.vocab_size}; "
                f"train/valid/test tokens {len(c.train)}/{len(c.valid)}/{len(c.test)}")

    def check(self, run: RunConfig, spans: list[tuple[int, int]]) -> None:
        """Fail before training when a segment, validation or the final evaluation could not run."""
        t, corpus = run.train, self.corpus
        if corpus.train_shards:  # shuffled sentences (lm1b): fixed segment length, no variable lengths
            if t.tgt_len_schedule or t.varlen:
                raise TxlError("train.tgt_len_schedule and train.varlen are not supported for a shuffled-sentence "
                               "corpus (lm1b); remove them")
        else:
            n, b, max_tgt = len(corpus.train), t.batch_size, max(s[0] for s in spans)
            if n < b * max_tgt + 1:
                raise TxlError(f"the train split has {n} tokens, fewer than batch_size × tgt_len + 1 = {b * max_tgt + 1} "
                               "needed for one segment per stream; use a longer corpus, give the train split more "
                               "(data.split, or a longer data.train file) or lower train.batch_size/model.tgt_len")
        if len(corpus.valid) < 2:
            raise TxlError("the valid split is empty: validation needs it; give data.split a valid fraction > 0 "
                           "or a data.valid file")
        tokens = corpus.valid if run.eval.split == "valid" else corpus.test
        if len(tokens) < 2:
            raise TxlError(f"the {run.eval.split} split is empty: the final evaluation needs it; set eval.split=valid "
                           "or give a test split")
        if run.eval.warmup:
            need = (run.model.mem_len if run.eval.mem_len is None else run.eval.mem_len) + 2
            if len(tokens) < need:
                raise TxlError(f"eval.warmup needs at least eval.mem_len + 2 = {need} tokens in the {run.eval.split} "
                               f"split, which has {len(tokens)}; lower eval.mem_len or turn eval.warmup off")

    def init_weights(self, model: TransformerXLLM) -> None:
        """A new language model starts from its seeded initialisation: nothing to do."""

    def fingerprint(self) -> dict:
        """Token count and sha256 of each split's token array (for a shuffled-sentence corpus, of the
        training shard files instead of the empty train array)."""
        c = self.corpus
        parts = {f"{name} split": split_digest(c, name) for name in SPLITS}
        if c.train_shards:
            del parts["train split"]
            parts["train shards"] = files_digest(list(c.train_shards))
        return parts

    def batches(self, run: RunConfig, device: torch.device):
        return (_ShuffledBatches if self.corpus.train_shards else _OrderedBatches)(self.corpus, run, device)

    def objective(self, model: TransformerXLLM) -> torch.nn.Module:
        """The model itself: ``model(x, mems=, labels=, span=)`` is the language-modelling loss."""
        return model

    def validate(self, model: TransformerXLLM, run: RunConfig, span, dist) -> EvalResult:
        """Periodic validation: the valid split (``train.eval_max_tokens`` of it) at the training span."""
        t = run.train
        return evaluate(model, self.corpus.valid, unit=self.unit, batch_size=run.eval.batch_size,
                        max_tokens=t.eval_max_tokens, dtype=t.dtype, dist=dist, span=span)

    def final(self, model: TransformerXLLM, run: RunConfig, dist, progress: bool = False) -> EvalResult:
        """The final report: ``run.eval.split`` (not empty: :meth:`check`) with the ``[eval]`` span settings,
        the streams split over the ranks of ``dist``; ``progress``: a progress bar on stderr."""
        e = run.eval
        tokens = self.corpus.valid if e.split == "valid" else self.corpus.test
        return evaluate(model, tokens, unit=self.unit, batch_size=e.batch_size, tgt_len=e.tgt_len, mem_len=e.mem_len,
                        clamp_len=e.clamp_len, same_length=e.same_length, cmem_len=e.cmem_len, warmup=e.warmup,
                        max_tokens=e.max_tokens, dtype=run.train.dtype, dist=dist,
                        progress=progress and f"final evaluation ({e.split})")

    def sample(self, model: TransformerXLLM, run: RunConfig) -> tuple[str, str]:
        return sample_text(model, self.corpus, run.train.sample_prompt, run.train.sample_tokens, seed=run.train.seed)


def sample_text(model: TransformerXLLM, corpus: CorpusSplits, prompt: str, n_tokens: int, seed: int,
                temperature: float = 0.8, top_p: float = 0.95) -> tuple[str, str]:
    """Sample ``n_tokens`` after ``prompt``; returns (prompt, continuation).

    An empty ``prompt`` uses the first whole lines of the valid split.
    """
    tok = corpus.tokenizer
    if not prompt:
        head = tok.decode(corpus.valid[:400])
        lines = head.split("\n")
        prompt = "\n".join(lines[1:-1]) + "\n" if len(lines) > 2 else head  # whole lines only
    ids = tok.encode(prompt)
    device = next(model.parameters()).device
    x = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device)[None]
    out = generate(model, x, n_tokens, temperature=temperature, top_p=top_p,
                   generator=torch.Generator(device=device).manual_seed(seed))
    return prompt, tok.decode(out[0, x.size(1):].tolist())
