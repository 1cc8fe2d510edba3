"""Throughput and memory of txl against references in the same run (``txl bench``, docs/benchmarks.md).

- :mod:`.command`: the ``txl bench`` command;
- :mod:`.bench`: training and evaluation throughput, peak memory, transformers' TransfoXL side by side,
  the sliding-window speed-up (the paper's Table 9);
- :mod:`.generation`, :mod:`.quantize`, :mod:`.compile`, :mod:`.export`: decoding against the attended
  length, int8/bf16 weights, torch.compile and the ONNX decoder, each against eager float32.
"""
