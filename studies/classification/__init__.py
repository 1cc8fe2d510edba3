"""Long-document classification: which standard-library package a piece of its source comes from
(docs/classification.md).

- :mod:`.data`: the documents, labelled by package and split by file (``txl data packages``, :mod:`.command`);
- :mod:`.run`: every reading of a document (memory, every segment pooled, first/last segment, a window,
  ERNIE-Doc's recipes) fine-tuned for several seeds against TF-IDF + logistic regression, with paired
  intervals (``python -m txl_studies.classification.run``);
- :mod:`.head`, :mod:`.probe`: the classifier's head start and the probe's penalty;
  :mod:`.baselines`: TF-IDF + logistic regression; :mod:`.by_length`: accuracy by document length from
  :mod:`.run`'s JSON; :mod:`.demo`: a small demo.
"""
