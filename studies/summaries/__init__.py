"""Summaries of long documents: a docstring's first sentence written from a function's source
(docs/finetuning.md, "Summaries of long documents, measured").

- :mod:`.data`: the pairs from the standard library, split by module (``txl data docstrings``, :mod:`.command`);
- :mod:`.run`: the measurement end to end: data, language model, fine-tuning seeds, ROUGE with
  intervals against the name and the last segment (``python -m txl_studies.summaries.run``);
- :mod:`.attention`: where the summarizer's attention goes, by distance (``python -m
  txl_studies.summaries.attention``).
"""
