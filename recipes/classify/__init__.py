"""``txl classify``: fine-tune a language model into a long-document classifier, and predict with it.

- :mod:`.command`: the command line (``txl classify train``, ``txl classify predict``);
- :mod:`.config`: :class:`~.config.ClassifyTrainConfig`, the settings of ``txl classify train``;
- :mod:`.documents`: labelled documents (a folder per label, or JSON Lines) and a stratified split;
- :mod:`.probe`: the linear probe that starts the head;
- :mod:`.task`: the classification task the shared training loop (:func:`txl.training.loop.train`) runs;
- :mod:`.train`: :func:`~.train.fit_classifier`, the Python form of ``txl classify train``, and the
  held-out metrics.

Nothing is imported here: ``txl`` loads :mod:`.command` at start-up, before any torch import.
"""
