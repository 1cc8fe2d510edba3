"""Document classification with segment-level recurrence.

A document of any length is read segment by segment (``tgt_len`` tokens each) by a Transformer-XL
body, carrying the memory from one segment to the next exactly as the language model does (paper
§3.2). The final hidden states are pooled and a linear head gives one score per label. This is the
"long context through recurrence" use of the paper's model on a task other than language modelling.

Batches are right-padded. Under causal attention a real token never attends to a later position, so
padding after a document's end cannot change its states; each row is pooled at its own last real
token (or over its own last segment's real tokens), and a row whose document has ended is dropped
from the batch for the remaining segments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from txl.classification.serialization import load_classifier_weights, read_classifier, save_classifier
from txl.config import CLASSIFIER_NAME
from txl.errors import TxlError
from txl.model.segments import segments
from txl.model.config import TransformerXLConfig, check_fields
from txl.model.parameters import init_weights
from txl.model.quantize import check_trainable
from txl.model.transformer import TransformerXLLM

MODES = ("memory", "first", "last")
POOLINGS = ("last", "mean")


@dataclass
class ClassifierConfig:
    """Settings of the classification head and of how a document is read.

    Attributes:
        num_labels: number of classes (>= 2).
        labels: class names, one per class index, as the training data gave them: strings, or integers
            from JSON Lines labels (default ``"0" .. "num_labels-1"``); no two with the same text.
        mode: ``"memory"``: the whole document, segment after segment with the memory (needs
            ``attn_type="rel"``); ``"first"``: only the first ``tgt_len`` tokens, no memory;
            ``"last"``: only the last ``tgt_len`` tokens, no memory ("first" and "last" are the modes of
            the vanilla ``attn_type="abs"`` model, which reads one window).
        pooling: ``"last"``: the last layer's state at the document's last real token (the last one
            read, in ``"first"`` mode); ``"mean"``: mean of the last layer's states over the real tokens of
            the document's last segment.
        grad_segments: K >= 1: gradients flow through the last K segments of each document only
            (earlier segments run without autograd and their memory is detached; between the last K
            segments the memory keeps its graph: truncated back-propagation through time). K = 1 is
            the paper's stop-gradient memory. None: through every segment (memory grows with length).
        classifier_dropout: dropout probability on the pooled vector before the linear head.
        max_tokens: documents are cut to their first ``max_tokens`` tokens when encoded (None: whole;
            ``"last"`` mode then reads the last ``tgt_len`` tokens of the cut document).
    """

    num_labels: int
    labels: list[str | int] = dataclasses.field(default_factory=list)
    mode: str = "memory"
    pooling: str = "last"
    grad_segments: int | None = 1
    classifier_dropout: float = 0.1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = [str(i) for i in range(self.num_labels)]
        self.validate()

    def validate(self) -> None:
        """Raise :class:`TxlError` naming the first impossible value."""
        check_fields(type(self), dataclasses.asdict(self), "classifier")
        if self.num_labels < 2:
            raise TxlError(f"a classifier needs at least 2 labels, got {self.num_labels}")
        if len(self.labels) != self.num_labels or len({str(x) for x in self.labels}) != self.num_labels:
            raise TxlError(f"labels must be {self.num_labels} names with distinct texts, got {self.labels}")
        if self.mode not in MODES:
            raise TxlError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.pooling not in POOLINGS:
            raise TxlError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.grad_segments is not None and self.grad_segments < 1:
            raise TxlError(f"grad_segments must be >= 1 (or None for all segments), got {self.grad_segments}")
        if not 0.0 <= self.classifier_dropout < 1.0:
            raise TxlError(f"classifier_dropout must be in [0, 1), got {self.classifier_dropout}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise TxlError(f"max_tokens must be >= 1 (or None for whole documents), got {self.max_tokens}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ClassifierConfig":
        """Build from a plain dict (e.g. JSON); unknown keys and wrong types raise :class:`TxlError`."""
        if not isinstance(values, dict) or "num_labels" not in values:
            raise TxlError("classifier config must be an object with num_labels")
        return cls(**check_fields(cls, values, "classifier"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of all fields."""
        return dataclasses.asdict(self)


@dataclass
class ClassifierOutput:
    """What :meth:`TransformerXLForSequenceClassification.forward` returns.

    Attributes:
        logits: float [B, num_labels] class scores (softmax gives the probabilities).
        loss: float scalar, mean cross-entropy in nats over the batch (None without labels).
        pooled: float [B, d_model] the pooled document vectors fed (after dropout) to the head.
    """

    logits: torch.Tensor
    loss: torch.Tensor | None
    pooled: torch.Tensor


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
        logits = self.head(self.dropout(pooled))
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
            return self._pool(h, lengths.clamp(max=n))
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
        return self._pool(h, counts)

    def _encode_with_memory(self, input_ids: torch.Tensor, lengths: torch.Tensor, tgt_len: int) -> torch.Tensor:
        """Read every segment with the memory (the segment loop of :mod:`txl.model.segments`); pool
        each row in the segment holding its last token."""
        last_seg = (lengths - 1) // tgt_len  # [B] segment of each row's last real token
        k = self.classifier.grad_segments
        grad_from = None
        if torch.is_grad_enabled():  # row b gets gradients through segments grad_from[b] .. last_seg[b]
            grad_from = (last_seg - k + 1).clamp(min=0) if k is not None else torch.zeros_like(last_seg)
        rows_out, vecs_out = [], []
        for seg in segments(self.body, input_ids[:, :int(lengths.max())], span=self.body.config.span, lengths=lengths,
                            grad=grad_from is not None, grad_from=grad_from, hidden=True):
            ending = last_seg[seg.rows] == seg.index
            if bool(ending.any()):
                rows = seg.rows[ending]
                rows_out.append(rows)
                vecs_out.append(self._pool(seg.hidden[ending], lengths[rows] - seg.start))
        rows = torch.cat(rows_out)
        pooled = torch.cat(vecs_out)
        return pooled[torch.argsort(rows)]

    def _pool(self, h: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """[N, T, d] states, [N] real-token counts in [1, T] -> [N, d] (last real state or their mean)."""
        if self.classifier.pooling == "last":
            return h[torch.arange(h.size(0), device=h.device), counts - 1]
        real = (torch.arange(h.size(1), device=h.device)[None, :] < counts[:, None]).to(h.dtype)  # [N, T]
        return (h * real[:, :, None]).sum(1) / counts[:, None].to(h.dtype)

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
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        out = torch.empty(len(documents), self.classifier.num_labels)
        try:
            for index, ids, lengths in batch_documents(documents, batch_size, self.classifier.max_tokens):
                logits = self(ids.to(device), lengths.to(device)).logits
                out[index] = logits.float().softmax(-1).cpu()
        finally:
            self.train(was_training)
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
        """
        save_classifier(self, directory, extra)

    @classmethod
    def from_pretrained(cls, directory: str | Path,
                        map_location: str = "cpu") -> "TransformerXLForSequenceClassification":
        """Load a folder written by :meth:`save_pretrained` or a checkpoint of a classification run
        (safetensors + JSON only), in eval mode. A run folder of ``txl classify train`` gives its ``best/``.

        Raises:
            TxlError: missing folder or files, invalid JSON, or weights that do not match the configs.
        """
        directory = Path(directory)
        if not (directory / CLASSIFIER_NAME).is_file() and (directory / "best" / CLASSIFIER_NAME).is_file():
            directory = directory / "best"  # a classification run: its final checkpoint
        config, values = read_classifier(directory)
        model = cls(config, classifier=ClassifierConfig.from_dict(values))
        load_classifier_weights(model, directory, map_location)
        return model.to(map_location).eval()
