"""A document classifier on Transformer-XL recurrence (see :mod:`txl.classification.model`).

Its fine-tuning, the linear probe that starts its head and ``txl classify`` are the classify recipe,
:mod:`txl_recipes.classify`.
"""

from txl.classification.model import ClassifierOutput, TransformerXLForSequenceClassification
from txl.config import ClassifierConfig

__all__ = ["ClassifierConfig", "ClassifierOutput", "TransformerXLForSequenceClassification"]
