"""``txl plot``: learning curves of runs (:mod:`.curves`) and the attention distances of a checkpoint
(:mod:`.attention`); :mod:`.command` holds the flags. matplotlib is the optional ``plot`` extra."""
