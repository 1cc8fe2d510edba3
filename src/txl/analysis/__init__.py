"""Research tools built on evaluation and training: RECL, attention maps, ablations, benchmarks and plots
(all matplotlib use lives in :mod:`txl.analysis.plots`)."""
