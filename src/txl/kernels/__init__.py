"""Speed work below the model, a floor a reader of the mathematics may skip: the CPU forms of the model's
products, dropout and position bias (:mod:`txl.kernels.cpu`) and int8 weights (:mod:`txl.kernels.int8`).
The CPU forms give the plain computation's numbers up to float rounding (dropout: the same
distribution); int8 weights are an approximation of their own (docs/quantization.md)."""
