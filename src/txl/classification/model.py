"""Document classification with segment-level recurrence.

A document of any length is read segment by segment (``tgt_len`` tokens each) by a Transformer-XL
body, carrying the memory from one segment to the next exactly as the language model does (paper
§3.2). The last layer's states are pooled into one vector and a linear head gives one score per
label. By default every segment feeds the pooled vector (a running mean over the whole document),
so any part of a document reaches the head however far it lies beyond the memory's reach; the
pooling of the last segment alone, ERNIE-Doc's retrospective feed (two readings) and its enhanced
(same-layer) recurrence are the other readings (:class:`ClassifierConfig`).

Batches are right-padded. Under causal attention a real token never attends to a later position, so
padding after a document's end cannot change its states; each row is pooled over its own real tokens
only, and a row whose document has ended is dropped from the batch for the remaining segments.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from torch import nn

from txl.config import (CHECKSUMS_NAME, CLASSIFIER_NAME, CONFIG_NAME, STATE_NAME, VOCAB_NAME, ClassifierConfig,
                        TransformerXLConfig)
from txl.data import load_tokenizer
from txl.errors import TxlError
from txl.fileio import read_json_object, write_json
from txl.fileio.model_files import load_weights, read_model_config, save_model
from txl.segments import eval_mode, segments
from txl.model.parameters import init_weights
from txl.kernels.cpu import check_reading_fits
from txl.fileio.model_files import check_trainable
from txl.model.transformer import TransformerXLLM


@dataclass
class ClassifierOutput:
    """What :meth:`TransformerXLForSequenceClassification.forward` returns.

    Attributes:
        logits: float [B, num_labels] class scores (softmax gives the probabilities).
        loss: float scalar, mean cross-entropy in nats over the batch (None without labels).
        pooled: float [B, d_model] the pooled document vectors (standardized as the probe set, then
            after dropout, they are what the head reads).
    """

    logits: torch.Tensor
    loss: torch.Tensor | None
    pooled: torch.Tensor


class _Pool:
    """The pooled vectors of a batch of documents read segment by segment, in constant memory: one
    :meth:`add` per segment (the rows in it, their states, their real-token counts, which rows end
    there), then :meth:`result`, float [B, d] (float32 at least: sums of bfloat16 states are kept wider).

    ``"document"`` keeps a running sum and count; ``"attention"`` a running softmax (its maximum score,
    the sum of the weights, the weighted sum of states), the scores ``h . query``; ``"last"`` and
    ``"mean"`` pool the segment in which a row ends. Autograd flows through what was added with it.
    """

    def __init__(self, kind: str, bsz: int, d: int, device, query: torch.Tensor | None = None) -> None:
        self.kind, self.query = kind, query
        self.sums: torch.Tensor | None = None  # [B, d]: the states' (weighted) sum, or the pooled vector
        self.weights = torch.zeros(bsz, device=device)  # [B]: tokens counted, or the softmax's denominator
        self.top = torch.full((bsz,), float("-inf"), device=device)  # [B]: "attention": the largest score so far
        self.bsz, self.d = bsz, d

    def add(self, rows: torch.Tensor, h: torch.Tensor, counts: torch.Tensor, ending: torch.Tensor) -> None:
        dtype = torch.promote_types(h.dtype, torch.float32)
        if self.sums is None:
            self.sums = torch.zeros(self.bsz, self.d, device=h.device, dtype=dtype)
            self.weights, self.top = self.weights.to(dtype), self.top.to(dtype)
        h = h.to(dtype)
        real = torch.arange(h.size(1), device=h.device)[None, :] < counts[:, None]  # [b, t]
        if self.kind in ("last", "mean"):  # the segment holding the row's last token
            if bool(ending.any()):
                h, real, counts, rows = h[ending], real[ending], counts[ending], rows[ending]
                if self.kind == "last":
                    vec = h[torch.arange(h.size(0), device=h.device), counts - 1]
                else:
                    vec = (h * real[:, :, None].to(dtype)).sum(1) / counts[:, None].to(dtype)
                self.sums = self.sums.index_copy(0, rows, vec)
                self.weights = self.weights.index_fill(0, rows, 1.0)
            return
        if self.kind == "document":
            self.sums = self.sums.index_add(0, rows, (h * real[:, :, None].to(dtype)).sum(1))
            self.weights = self.weights.index_add(0, rows, counts.to(dtype))
            return
        scores = (h @ self.query.to(dtype)).masked_fill(~real, float("-inf"))  # [b, t]
        top = torch.maximum(self.top[rows], scores.max(1).values)  # [b]: every row has a real token here
        old = torch.exp(self.top[rows] - top)  # the earlier sums rescaled to the new maximum (0 at first)
        w = torch.exp(scores - top[:, None])  # [b, t]; 0 at padding
        self.sums = self.sums.index_copy(0, rows, self.sums[rows] * old[:, None] + (w[:, :, None] * h).sum(1))
        self.weights = self.weights.index_copy(0, rows, self.weights[rows] * old + w.sum(1))
        self.top = self.top.index_copy(0, rows, top)

    def result(self) -> torch.Tensor:
        if self.kind == "last":
            return self.sums
        return self.sums / self.weights[:, None]


class TransformerXLForSequenceClassification(nn.Module):
    """Transformer-XL body + pooled linear head for classifying documents of any length.

    Parameters: ``body`` (a whole :class:`~txl.model.TransformerXLLM`, so that its weights load
    unchanged from a language-model checkpoint; its softmax is not used), ``dropout`` and ``head``
    (``nn.Linear(d_model, num_labels)``, normal(0, init_std) weights, zero bias).

    ``tokenizer`` is the language model's tokenizer when built by :meth:`from_pretrained_lm` or
    :meth:`from_pretrained` (None otherwise); it is not part of the module's state.

    Raises:
        TxlError: ``mode="memory"`` with ``attn_type="abs"`` (the vanilla model has no memory), or
            bad settings (see :class:`ClassifierConfig`).
    """

    param_kinds = {"pool_query": "bias"}  # a vector that starts at zero and takes no weight decay

    def __init__(self, config: TransformerXLConfig, num_labels: int | None = None, *,
                 classifier: ClassifierConfig | None = None, **settings: Any) -> None:
        super().__init__()
        if classifier is None:
            if num_labels is None:
                raise TxlError("give num_labels (or a ClassifierConfig)")
            classifier = ClassifierConfig(num_labels=num_labels, **settings)
        elif num_labels is not None or settings:
            raise TxlError("give either a ClassifierConfig or num_labels and settings, not both")
        if classifier.mode == "memory" and not config.has_memory:
            raise TxlError(f"mode='memory' needs a model with memory (attn_type 'rel', 'shaw' or 'rope'); the attn_type={config.attn_type!r} model has "
                           "no memory: use mode='first' or 'last' (one window of tgt_len tokens)")
        self.classifier = classifier
        self.body = TransformerXLLM(config)
        self.dropout = nn.Dropout(classifier.classifier_dropout)
        self.head = nn.Linear(config.d_model, classifier.num_labels)
        init_weights(self.head, config.init_std, config.proj_init_std)  # normal(0, init_std) weight, zero bias
        if classifier.pooling == "attention":  # the score of a state h is h . pool_query; zero: the plain mean
            self.pool_query = nn.Parameter(torch.zeros(config.d_model))
        if classifier.head_init == "probe":  # the pooled vector's standardization, set by the probe (identity until then)
            self.register_buffer("pool_shift", torch.zeros(config.d_model))
            self.register_buffer("pool_scale", torch.ones(config.d_model))
        self.tokenizer = None

    @property
    def config(self) -> TransformerXLConfig:
        """The body's :class:`TransformerXLConfig` (``tgt_len`` is the segment length, ``mem_len`` the memory)."""
        return self.body.config

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> ClassifierOutput:
        """Classify a batch of right-padded documents.

        Args:
            input_ids: int64 [B, L] token ids; row b holds its document in ``[:lengths[b]]``, any
                valid ids after that (padding) are ignored.
            lengths: int64 [B] number of real tokens per row, each in ``[1, L]`` (None: all L).
            labels: int64 [B] class indices in ``[0, num_labels)``, or None.

        Returns:
            :class:`ClassifierOutput` with logits [B, num_labels] and, with labels, the mean
            cross-entropy (nats).

        Raises:
            TxlError: bad ranks/dtypes, lengths outside ``[1, L]``, labels out of range, or token ids
                outside the vocabulary.
        """
        pooled = self.encode(input_ids, lengths)
        features = pooled if self.classifier.head_init == "random" else (pooled - self.pool_shift) * self.pool_scale
        logits = self.head(self.dropout(features.to(self.head.weight.dtype)))
        loss = None
        if labels is not None:
            if labels.shape != (input_ids.size(0),):
                raise TxlError(f"labels must be [batch] = [{input_ids.size(0)}], got {tuple(labels.shape)}")
            if int(labels.min()) < 0 or int(labels.max()) >= self.classifier.num_labels:
                raise TxlError(f"labels must be class indices in [0, {self.classifier.num_labels})")
            loss = F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels)
        return ClassifierOutput(logits=logits, loss=loss, pooled=pooled)

    def encode(self, input_ids: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled document vectors, float [B, d_model] (see :class:`ClassifierConfig` for the modes).

        In ``"memory"`` mode segment s of every row is ``input_ids[:, s*tgt_len:(s+1)*tgt_len]``; the
        memory after segment s is the input of the next one (paper §3.2), so the state at a document's
        last token has seen up to ``n_layer * mem_len`` earlier tokens, not only its own segment.

        Raises:
            TxlError: as :meth:`forward`.
        """
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise TxlError(f"input_ids must be an integer tensor [batch, length], got {input_ids.dtype} "
                           f"{tuple(input_ids.shape)}")
        bsz, total = input_ids.shape
        if bsz == 0 or total == 0:
            raise TxlError("input_ids is empty: give at least one document of at least one token")
        if lengths is None:
            lengths = torch.full((bsz,), total, dtype=torch.long, device=input_ids.device)
        lengths = lengths.to(device=input_ids.device, dtype=torch.long)
        if lengths.shape != (bsz,) or int(lengths.min()) < 1 or int(lengths.max()) > total:
            raise TxlError(f"lengths must be [batch] = [{bsz}] counts in [1, {total}], got {lengths.tolist()}")
        tgt_len = self.config.tgt_len
        if self.classifier.mode == "first":
            n = min(total, tgt_len)
            h, _ = self.body.hidden_states(input_ids[:, :n], None)
            return self._window(h, lengths.clamp(max=n))
        if self.classifier.mode == "last":
            return self._encode_last(input_ids, lengths, tgt_len)
        return self._encode_with_memory(input_ids, lengths, tgt_len)

    def _encode_last(self, input_ids: torch.Tensor, lengths: torch.Tensor, tgt_len: int) -> torch.Tensor:
        """Read only each row's last ``min(length, tgt_len)`` real tokens, moved to the row's start (no memory)."""
        counts = lengths.clamp(max=tgt_len)  # [B] tokens read per row
        n = int(counts.max())
        cols = (lengths - counts)[:, None] + torch.arange(n, device=input_ids.device)[None, :]  # [B, n]
        ids = input_ids.gather(1, cols.clamp(max=input_ids.size(1) - 1))  # after a row's end: padding, never seen
        h, _ = self.body.hidden_states(ids, None)
        return self._window(h, counts)

    def _encode_with_memory(self, input_ids: torch.Tensor, lengths: torch.Tensor, tgt_len: int) -> torch.Tensor:
        """Read every segment with the memory (the segment loop of :mod:`txl.segments`) and pool as
        :class:`ClassifierConfig` says: every segment feeds a running pool, or the segment holding a
        row's last token is pooled. With ``passes=2`` the pooled reading starts from the memory a first
        reading without autograd left at each row's end."""
        c = self.classifier
        ids = input_ids[:, :int(lengths.max())]
        last_seg = (lengths - 1) // tgt_len  # [B] segment of each row's last real token
        grad_from = None
        if torch.is_grad_enabled():  # row b gets gradients through segments grad_from[b] .. last_seg[b]
            k = c.grad_segments
            grad_from = (last_seg - k + 1).clamp(min=0) if k is not None else torch.zeros_like(last_seg)
        same_layer = c.recurrence == "same_layer"
        if c.passes == 1:
            return self._read(ids, lengths, last_seg, None, grad_from, same_layer)
        with torch.no_grad():  # the first reading: each row's memory at its end
            ends = self._end_memories(ids, lengths, last_seg, same_layer)
        order, vectors = [], []
        for size in sorted({m[0].size(0) for m in ends}):  # rows left memories of one length: read together
            group = [b for b, m in enumerate(ends) if m[0].size(0) == size]
            rows = torch.tensor(group, device=ids.device)
            mems = [torch.stack([ends[b][i] for b in group]) for i in range(self.config.n_layer)]
            order.append(rows)
            vectors.append(self._read(ids[rows], lengths[rows], last_seg[rows], mems,
                                      None if grad_from is None else grad_from[rows], same_layer))
        return torch.cat(vectors)[torch.argsort(torch.cat(order))]

    def _end_memories(self, ids: torch.Tensor, lengths: torch.Tensor, last_seg: torch.Tensor,
                      same_layer: bool) -> list[list[torch.Tensor]]:
        """Per row, the memory a reading of its document leaves at its end: ``n_layer`` tensors [M, d_model],
        the states of the document's last M tokens (M <= mem_len; the padding after its end left out)."""
        span = self.body.config.span
        if span.mem_len < span.tgt_len:  # the new memory must hold the whole last segment to leave its padding out
            raise TxlError(f"passes=2 needs mem_len >= tgt_len (the memory holds a whole segment), got mem_len "
                           f"{span.mem_len} and tgt_len {span.tgt_len}")
        ends: list = [None] * ids.size(0)
        last, n = last_seg.tolist(), lengths.tolist()  # on the host once
        check_reading_fits(self.body, ids, span)
        for seg in segments(self.body, ids, span=span, lengths=lengths, hidden=True, same_layer=same_layer):
            width = seg.inputs.size(1)
            for j, b in enumerate(seg.rows.tolist()):
                if last[b] == seg.index:  # memory in + this segment's real states, the last mem_len of them
                    real = n[b] - seg.start
                    ends[b] = [torch.cat(([] if seg.mems is None else [seg.mems[i][j]])
                                         + [new[j, new.size(1) - width:][:real]])[-span.mem_len:]
                               for i, new in enumerate(seg.output.mems)]
        return ends

    def _read(self, ids: torch.Tensor, lengths: torch.Tensor, last_seg: torch.Tensor, mems, grad_from,
              same_layer: bool) -> torch.Tensor:
        """One reading of ``ids`` [B, N] from ``mems`` (None: none) pooled per :class:`ClassifierConfig`: [B, d]."""
        pool = _Pool(self.classifier.pooling, ids.size(0), self.config.d_model, ids.device,
                     getattr(self, "pool_query", None))
        check_reading_fits(self.body, ids, self.body.config.span, mems, grad=grad_from is not None)
        for seg in segments(self.body, ids, span=self.body.config.span, mems=mems, lengths=lengths,
                            grad=grad_from is not None, grad_from=grad_from, hidden=True, same_layer=same_layer):
            counts = (lengths[seg.rows] - seg.start).clamp(max=seg.hidden.size(1))  # real tokens of each row here
            h = seg.hidden
            if grad_from is not None and h.requires_grad:  # a row before its window: a constant, as when alone
                h = torch.where((grad_from[seg.rows] <= seg.index)[:, None, None], h, h.detach())
            pool.add(seg.rows, h, counts, ending=last_seg[seg.rows] == seg.index)
        return pool.result()

    def _window(self, h: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The pooled vectors [N, d] of one window each: states [N, T, d] with [N] real-token counts in [1, T]."""
        pool = _Pool(self.classifier.pooling, h.size(0), h.size(-1), h.device, getattr(self, "pool_query", None))
        rows = torch.arange(h.size(0), device=h.device)
        pool.add(rows, h, counts, ending=torch.ones_like(rows, dtype=torch.bool))
        return pool.result()

    @torch.no_grad()
    def predict_proba(self, documents: list, batch_size: int = 8) -> torch.Tensor:
        """Class probabilities for texts (encoded with ``self.tokenizer``) or 1-D token-id sequences.

        Documents are cut to ``max_tokens`` and batched by similar length; the module is put in eval
        mode (no dropout) for the call and restored afterwards.

        Returns:
            float32 [N, num_labels] probabilities (rows sum to 1), in the order of ``documents``.

        Raises:
            TxlError: empty documents, texts without a tokenizer, or ``batch_size`` < 1.
        """
        from txl.classification.data import batch_documents, encode_texts

        if batch_size < 1:
            raise TxlError(f"batch_size must be >= 1, got {batch_size}")
        if any(isinstance(d, str) for d in documents):
            if self.tokenizer is None:
                raise TxlError("texts need a tokenizer: load with from_pretrained/from_pretrained_lm or pass token ids")
            documents = encode_texts(self.tokenizer, documents, self.classifier.max_tokens)
        device = next(self.parameters()).device
        out = torch.empty(len(documents), self.classifier.num_labels)
        with eval_mode(self):
            for index, ids, lengths in batch_documents(documents, batch_size, self.classifier.max_tokens):
                logits = self(ids.to(device), lengths.to(device)).logits
                out[index] = logits.float().softmax(-1).cpu()
        return out

    @classmethod
    def from_pretrained_lm(cls, checkpoint: str | Path, num_labels: int, *, tgt_len: int | None = None,
                           mem_len: int | None = None, map_location: str = "cpu",
                           **settings: Any) -> "TransformerXLForSequenceClassification":
        """A classifier whose body is a trained txl language model (a checkpoint or run directory).

        Args:
            checkpoint: folder written by ``txl train`` (run directory: its ``best/``) or by
                ``save_pretrained``.
            num_labels: number of classes.
            tgt_len, mem_len: segment and memory length for reading documents (None: the LM's); the
                classifier's own model config records them (the loaded LM is not changed).
            settings: the other :class:`ClassifierConfig` fields (labels, mode, pooling, ...).

        Returns:
            The classifier in train mode, with the LM's weights in ``body`` (bit for bit), a freshly
            initialised head and ``tokenizer`` set to the LM's tokenizer.

        Raises:
            TxlError: unknown or broken checkpoint, or bad settings.
        """
        from txl.training.checkpoint import load_checkpoint

        lm = load_checkpoint(checkpoint, map_location=map_location)
        check_trainable(lm.model.state_dict(), str(lm.path))
        reading = lm.model.config.span.replace(tgt_len=tgt_len, mem_len=mem_len)  # checked: TxlError
        config = dataclasses.replace(lm.model.config, tgt_len=reading.tgt_len, mem_len=reading.mem_len)
        model = cls(config, num_labels, **settings).to(map_location)
        model.body.load_state_dict(lm.model.state_dict())
        model.tokenizer = lm.tokenizer
        return model.train()

    def save_pretrained(self, directory: str | Path, extra: dict[str, Any] | None = None) -> None:
        """Write a classifier checkpoint folder atomically (a temporary sibling, then renamed).

        Files: ``model.safetensors`` (body and head), ``config.json`` (the body's model config),
        ``classifier.json`` (:class:`ClassifierConfig` plus ``extra``) and, when a tokenizer is set,
        ``vocab.json``. An existing folder is replaced only once the new one is complete.

        Raises:
            TxlError: ``directory`` exists and is neither empty nor a classifier checkpoint (it is never
                replaced then); the write failed (disk full, permissions).
        """
        directory = Path(directory)
        if directory.exists() and (not directory.is_dir() or (any(directory.iterdir())
                                                               and not (directory / CLASSIFIER_NAME).is_file())):
            raise TxlError(f"{directory} exists and is not a classifier checkpoint; choose a new folder")
        tmp, old = (directory.with_name(directory.name + suffix) for suffix in (".tmp", ".old"))
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            save_model(self, tmp, self.tokenizer)
            write_json(tmp / CLASSIFIER_NAME, {**self.classifier.to_dict(), "extra": extra or {}})
        except (OSError, SafetensorError) as err:
            shutil.rmtree(tmp, ignore_errors=True)
            reason = getattr(err, "strerror", None) or err
            raise TxlError(f"could not write the classifier to {directory}: {reason}") from None
        if directory.exists():
            shutil.rmtree(old, ignore_errors=True)
            directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def from_pretrained(cls, directory: str | Path,
                        map_location: str = "cpu") -> "TransformerXLForSequenceClassification":
        """Load a folder written by :meth:`save_pretrained` or a checkpoint of a classification run
        (safetensors + JSON only), in eval mode. A run folder of ``txl classify train`` gives its ``best/``.

        Raises:
            TxlError: missing folder or files, a folder that is not a classifier checkpoint (e.g. a
                language-model checkpoint), a file that fails its checksum, invalid JSON, weights that do not
                match the configs, or a vocabulary of the wrong size.
        """
        directory = Path(directory)
        if not (directory / CLASSIFIER_NAME).is_file() and (directory / "best" / CLASSIFIER_NAME).is_file():
            directory = directory / "best"  # a classification run: its final checkpoint
        if not directory.is_dir():
            raise TxlError(f"classifier checkpoint {directory} " + ("is a file, not a folder" if directory.exists()
                                                                      else "does not exist"))
        if not (directory / CLASSIFIER_NAME).is_file():
            raise TxlError(f"{directory} is not a txl classifier checkpoint (no {CLASSIFIER_NAME}); "
                           "give the folder written by `txl classify train --out`")
        from txl.training.checkpoint_files import verify_checkpoint

        if not verify_checkpoint(directory) and (directory / STATE_NAME).is_file():  # a run's, checksums lost
            print(f"txl: warning: {directory} has no {CHECKSUMS_NAME}; its files cannot be verified", file=sys.stderr)
        values = read_json_object(directory / CLASSIFIER_NAME)
        values.pop("extra", None)
        model = cls(read_model_config(directory), classifier=ClassifierConfig.from_dict(values))
        load_weights(model, directory, map_location, f"{CONFIG_NAME} and {CLASSIFIER_NAME}")
        if (directory / VOCAB_NAME).is_file():
            model.tokenizer = load_tokenizer(directory / VOCAB_NAME)
            if model.tokenizer.vocab_size != model.config.vocab_size:
                raise TxlError(f"{directory / VOCAB_NAME} has {model.tokenizer.vocab_size} tokens but the model "
                               f"expects {model.config.vocab_size}")
        return model.to(map_location).eval()
