"""The exported decoder (``txl export``, docs/export.md): :mod:`txl_recipes.export.files` writes the two modules of
:mod:`txl.model.graphs` (the segment reader and the one-token step over a fixed-capacity ring) as ONNX or
``.pt2`` files with their manifest; :mod:`txl_recipes.export.runner` decodes greedily with those files."""
