"""The recipes: applications of txl that a user runs as ``txl`` commands, each in its own folder.

A recipe holds one application's command, settings, data reading and training steps, built on the
library's components (``txl``); the library never imports a recipe. Each command is registered
through the entry-point group ``txl.commands`` (``pyproject.toml``), so ``txl classify``,
``txl serve`` and ``txl summarize`` work as any other command:

- :mod:`.classify`: ``txl classify train|predict``, a long-document classifier fine-tuned from a
  language model (the classifier itself is :mod:`txl.classification`);
- :mod:`.serve`: ``txl serve``, an HTTP server whose sessions keep their memory between requests;
- :mod:`.summarize`: ``txl summarize``, completions of a fine-tuned model for documents, with ROUGE.
"""
