"""The recipes: applications of txl that a user runs as ``txl`` commands, each in its own folder.

A recipe holds one application's command, settings, data reading and training steps, built on the
library's components (``txl``); the library never imports a recipe. Each command is registered
through the entry-point group ``txl.commands`` (``pyproject.toml``), so each works as any other
``txl`` command:

- :mod:`.classify`: ``txl classify train|predict``, a long-document classifier fine-tuned from a
  language model (the classifier itself is :mod:`txl.classification`);
- :mod:`.datasets`: ``txl data prepare``, the standard benchmarks from their official archives;
- :mod:`.export`: ``txl export``, a checkpoint's decoder as ONNX or ``.pt2`` graphs, and their runner;
- :mod:`.plot`: ``txl plot``, learning curves of runs and attention distances of a checkpoint;
- :mod:`.serve`: ``txl serve``, an HTTP server whose sessions keep their memory between requests;
- :mod:`.summarize`: ``txl summarize``, completions of a fine-tuned model for documents, with ROUGE.
"""
