"""Learning-rate and segment-length schedules."""

from __future__ import annotations

import math


def learning_rate(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Linear warm-up from 0 to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``max_steps``.

    ``step`` counts from 1. Returns the learning rate for that step.
    """
    if warmup_steps and step <= warmup_steps:
        return lr * step / warmup_steps
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def segment_span(step: int, schedule: list[list[int]], tgt_len: int, mem_len: int) -> tuple[int, int]:
    """(tgt_len, mem_len) in force at ``step`` under a progressive segment-length schedule.

    ``schedule`` is ``[[step, tgt_len], ...]`` or ``[[step, tgt_len, mem_len], ...]`` with increasing
    steps: the last entry whose step is <= ``step`` applies; with pairs mem_len follows tgt_len. Before
    the first entry (or with an empty schedule) the model's ``tgt_len``/``mem_len`` apply.
    """
    current = (tgt_len, mem_len)
    for entry in schedule:
        if entry[0] > step:
            break
        current = (entry[1], entry[2] if len(entry) == 3 else entry[1])
    return current

