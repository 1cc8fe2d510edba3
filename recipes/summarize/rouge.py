"""ROUGE-1/2/L of summaries against references, with the ``rouge-score`` library (Lin 2004).

``rouge-score`` is an optional dependency: ``pip install -e '.[rouge]'``.
"""

from __future__ import annotations

from collections.abc import Sequence

from txl.errors import TxlError

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
#: what to install when ``rouge-score`` is missing (``txl summarize --rouge`` says it before any work)
ROUGE_MISSING = ("ROUGE needs the rouge-score library: in the txl folder, .venv/bin/python -m pip install -e "
                 "'.[rouge]' (or pip install rouge-score==0.1.2)")


def rouge_scores(predictions: Sequence[str], references: Sequence[str], stemmer: bool = True) -> dict:
    """Mean F-measures (in [0, 1]) over the pairs, and per-pair values.

    Scored with ``rouge_score.rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"],
    use_stemmer=stemmer)`` (its tokenizer lower-cases and keeps letters and digits).

    Returns:
        ``{"rouge1": mean F1, "rouge2": ..., "rougeL": ..., "n": pairs, "per_pair": [{type: F1}, ...]}``.

    Raises:
        TxlError: ``rouge-score`` is not installed, no pairs, or unequal lengths.
    """
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise TxlError(ROUGE_MISSING) from None
    if not predictions or len(predictions) != len(references):
        raise TxlError(f"ROUGE needs one reference per summary, got {len(predictions)} summaries and "
                       f"{len(references)} references")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stemmer)
    per_pair = []
    for pred, ref in zip(predictions, references):
        scores = scorer.score(ref, pred)  # (target, prediction)
        per_pair.append({t: scores[t].fmeasure for t in ROUGE_TYPES})
    means = {t: sum(p[t] for p in per_pair) / len(per_pair) for t in ROUGE_TYPES}
    return {**means, "n": len(per_pair), "per_pair": per_pair}
