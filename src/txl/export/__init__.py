"""The exported decoder (``txl export``, docs/export.md): :mod:`txl.export.graphs` (the segment reader and
the one-token step over a fixed-capacity ring, as modules to trace), :mod:`txl.export.files` (ONNX or
``.pt2`` files and their manifest), :mod:`txl.export.runner` (greedy decoding with the exported files)."""
