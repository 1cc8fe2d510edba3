"""The exported decoder (``txl export``, docs/export.md): :mod:`.files` writes two modules as ONNX or
``.pt2`` files with their manifest: the prompt reader (:mod:`.reader`) and the one-token step over a
fixed-capacity ring (:class:`txl.model.graphs.RingStep`, the step ``--compile`` runs too);
:mod:`.runner` decodes greedily with those files and :mod:`.command` holds the flags."""
