"""Analysis of trained models: attention probabilities from the plain reference (:mod:`.attention_maps`)
and matplotlib behind one import (:mod:`.plots`), for ``txl eval --sweep-mem``, the plot recipe and the
studies."""
