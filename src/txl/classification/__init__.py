"""Document classification with Transformer-XL recurrence (see :mod:`txl.classification.model`)."""

from txl.classification.model import ClassifierOutput, TransformerXLForSequenceClassification
from txl.config import ClassifierConfig
from txl.classification.probe import probe_head
from txl.classification.train import classification_metrics, fit_classifier

__all__ = ["ClassifierConfig", "ClassifierOutput", "TransformerXLForSequenceClassification",
           "classification_metrics", "fit_classifier", "probe_head"]
