"""Speed work below the model, a floor a reader of the mathematics may skip: the CPU forms of the model's
products, dropout and position bias (:mod:`txl.kernels.cpu`) and int8 weights (:mod:`txl.kernels.int8`).
Each gives the numbers of the plain computation up to float rounding."""
