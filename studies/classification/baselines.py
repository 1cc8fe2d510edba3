"""Baselines a practitioner tries before fine-tuning a language model: TF-IDF + logistic regression.

Needs scikit-learn, the optional ``bench`` extra (``pip install -e '.[bench]'``), imported only when a
baseline runs; the rest of txl never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from txl.errors import TxlError

ANALYZERS = ("word", "char_wb")


def tfidf_baseline(train_texts: Sequence[str], train_labels: Sequence, test_texts: Sequence[str], seed: int = 0,
                   analyzer: str = "word") -> np.ndarray:
    """Fit TF-IDF features + a logistic regression on the training documents; predict the test documents.

    The first try of a practitioner, scikit-learn's defaults plus the usual two changes:
    ``TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2))`` (word unigrams and bigrams, scikit-learn's
    default word pattern: runs of two or more letters, digits or underscores, lower-cased, so
    identifiers and keywords are the words of source code) and ``LogisticRegression(max_iter=1000)``
    (L2, C = 1, multinomial). ``analyzer="char_wb"`` uses character 2- to 4-grams inside word
    boundaries instead (the second thing one tries; it also sees punctuation and short names).

    Args:
        train_texts, train_labels: the training documents and their labels (any hashable labels).
        test_texts: the documents to label.
        seed: ``random_state`` of the solver (lbfgs is deterministic; kept for other solvers).
        analyzer: ``"word"`` or ``"char_wb"``.

    Returns:
        The predicted labels, a numpy array [len(test_texts)] of the training labels' values.

    Raises:
        TxlError: scikit-learn missing, no training or test documents, mismatched lengths, fewer than two
            labels, or an unknown analyzer.
    """
    if analyzer not in ANALYZERS:
        raise TxlError(f"analyzer must be one of {', '.join(ANALYZERS)}, got {analyzer!r}")
    if not train_texts or not test_texts or len(train_texts) != len(train_labels):
        raise TxlError(f"need training documents with one label each and test documents, got {len(train_texts)} "
                       f"documents, {len(train_labels)} labels and {len(test_texts)} test documents")
    if len(set(train_labels)) < 2:
        raise TxlError("the training documents need at least 2 labels")
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
    except ImportError:
        raise TxlError("the TF-IDF baseline needs scikit-learn: .venv/bin/python -m pip install -e '.[bench]'") from None
    if analyzer == "word":
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2))
    else:
        vectorizer = TfidfVectorizer(sublinear_tf=True, analyzer="char_wb", ngram_range=(2, 4))
    model = make_pipeline(vectorizer, LogisticRegression(max_iter=1000, random_state=seed))
    model.fit(list(train_texts), list(train_labels))
    return model.predict(list(test_texts))


__all__ = ["ANALYZERS", "tfidf_baseline"]
