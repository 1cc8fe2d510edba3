"""The settings of a document classifier (``txl classify``, :mod:`txl.classification`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from txl.config.fields import check_choice, check_fields, check_minimums
from txl.errors import TxlError

MODES = ("memory", "first", "last")
POOLINGS = ("document", "attention", "last", "mean")
RECURRENCES = ("previous_layer", "same_layer")
HEAD_INITS = ("probe", "random")


# what a classifier saved without these fields read with: one pass, the paper's memory, a head trained from
# random with no standardization of its pooled vector (used when loading and when resuming)
SAVED_WITHOUT: dict[str, Any] = {"passes": 1, "recurrence": "previous_layer", "head_init": "random"}

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
        pooling: what the head sees of the last layer's states. Of every segment, so that any part of
            the document reaches the head: ``"document"``, their mean over every real token of the
            document (a running sum: its memory does not grow with the document); ``"attention"``,
            their average weighted by a softmax over every real token of a learnt score ``h . q``
            (``q`` starts at zero: the document mean; kept as a running softmax, constant memory). Of
            the document's last segment only (what a state there reaches through the memory, at most
            ``n_layer x mem_len`` tokens back): ``"last"``, the state at the last real token;
            ``"mean"``, the mean over the segment's real tokens. In ``"first"`` and ``"last"`` modes
            every pooling reads the one window (``"document"`` = ``"mean"`` there).
        grad_segments: K >= 1: gradients flow through the last K segments of each document only
            (earlier segments run without autograd and their memory is detached; between the last K
            segments the memory keeps its graph: truncated back-propagation through time). With
            ``"document"`` or ``"attention"`` pooling the earlier segments' states still enter the
            pooled vector, as constants: the head and the score ``q`` learn from them, the body from
            the last K segments only. K = 1 is the paper's stop-gradient memory. None: through every
            segment (memory grows with length).
        passes: 1, or 2 for ERNIE-Doc's retrospective feed (Ding et al. 2021, §3.1): the document is
            read once without autograd, then again starting from the memory the first reading left,
            so that every segment of the second reading, the first included, attends to what the first
            reading kept at the document's end (its last ``n_layer x mem_len`` tokens with the paper's
            memory, more with ``"same_layer"``); the second reading is pooled ("memory" mode only;
            needs ``mem_len >= tgt_len``).
        recurrence: ``"previous_layer"`` (the paper) or ``"same_layer"``, ERNIE-Doc's enhanced
            recurrence: each layer's memory is its own output, so what a layer keeps can pass on
            from segment to segment without the ``n_layer x mem_len`` bound ("memory" mode only; a
            fine-tuning variant: the language model was trained with the paper's memory).
        head_init: ``"probe"``: training starts from a linear probe (:mod:`txl_recipes.classify.probe`):
            each feature of the pooled vectors is standardized by its mean and spread over the training
            documents (kept as the buffers ``pool_shift`` and ``pool_scale``) and the head starts as
            the logistic regression fitted on them. ``"random"``: no standardization, a random head
            (a classifier saved without this field).
        classifier_dropout: dropout probability on the pooled vector before the linear head.
        max_tokens: documents are cut to their first ``max_tokens`` tokens when encoded (None: whole;
            ``"last"`` mode then reads the last ``tgt_len`` tokens of the cut document).
    """

    num_labels: int
    labels: list[str | int] = dataclasses.field(default_factory=list)
    mode: str = "memory"
    pooling: str = "document"
    grad_segments: int | None = 1
    classifier_dropout: float = 0.1
    max_tokens: int | None = None
    passes: int = 1
    recurrence: str = "previous_layer"
    head_init: str = "probe"

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = [str(i) for i in range(self.num_labels)]
        self.check()

    def check(self) -> None:
        """Raise :class:`TxlError` naming the first impossible value."""
        check_fields(type(self), dataclasses.asdict(self), "classifier")
        if self.num_labels < 2:
            raise TxlError(f"a classifier needs at least 2 labels, got {self.num_labels}")
        if len(self.labels) != self.num_labels or len({str(x) for x in self.labels}) != self.num_labels:
            raise TxlError(f"labels must be {self.num_labels} names with distinct texts, got {self.labels}")
        for field, choices in (("mode", MODES), ("pooling", POOLINGS), ("head_init", HEAD_INITS)):
            check_choice(getattr(self, field), choices, field)
        if self.passes not in (1, 2):
            raise TxlError(f"passes must be 1 or 2 (the retrospective feed), got {self.passes}")
        check_choice(self.recurrence, RECURRENCES, "recurrence")
        if (self.passes == 2 or self.recurrence == "same_layer") and self.mode != "memory":
            given = "passes=2" if self.passes == 2 else "recurrence='same_layer'"
            raise TxlError(f"{given} reads with the memory: it needs mode='memory', not {self.mode!r}")
        if not 0.0 <= self.classifier_dropout < 1.0:
            raise TxlError(f"classifier_dropout must be in [0, 1), got {self.classifier_dropout}")
        check_minimums(self, {"grad_segments": 1, "max_tokens": 1}, "",
                       {"grad_segments": " (or None for all segments)", "max_tokens": " (or None for whole documents)"})

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ClassifierConfig":
        """Build from a plain dict (e.g. JSON); unknown keys and wrong types raise :class:`TxlError`."""
        if not isinstance(values, dict) or "num_labels" not in values:
            raise TxlError("classifier config must be an object with num_labels")
        return cls(**check_fields(cls, {**SAVED_WITHOUT, **values}, "classifier"))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of all fields."""
        return dataclasses.asdict(self)
