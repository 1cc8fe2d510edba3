"""Sampling over the whole valid space of temperature, top_k and top_p: always a well-defined draw."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from txl.generation import sample_next

V = 11


def _logits(seed: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, V, generator=g) * scale


temperatures = st.one_of(st.floats(min_value=1e-300, max_value=1e-30), st.floats(min_value=1e-30, max_value=1e6))
top_ps = st.one_of(st.none(), st.floats(min_value=5e-324, max_value=1e-30), st.floats(min_value=1e-30, max_value=1.0))
top_ks = st.one_of(st.none(), st.integers(min_value=1, max_value=V + 5))


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([1e-6, 1.0, 30.0, 1e4]), temperature=temperatures,
       top_k=top_ks, top_p=top_ps)
def test_every_valid_setting_draws_an_allowed_token(seed, scale, temperature, top_k, top_p):
    logits = _logits(seed, scale)
    token = sample_next(logits, temperature, top_k, top_p, generator=torch.Generator().manual_seed(seed))
    assert token.shape == (3,) and token.dtype == torch.int64
    # the drawn token is never worse than the k-th best (top_k) and always one of the allowed ones
    ranks = (logits > logits.gather(1, token[:, None])).sum(dim=1)  # tokens strictly better than the drawn one
    if top_k is not None:
        assert bool((ranks < top_k).all())
    if top_p is not None and top_p <= 1e-30 and scale >= 1.0:
        # the nucleus of a tiny top_p is the single most likely token
        assert torch.equal(token, logits.argmax(dim=1))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), temperature=st.floats(min_value=1e-300, max_value=1e-6))
def test_tiny_temperature_is_greedy(seed, temperature):
    logits = _logits(seed, 3.0)
    token = sample_next(logits, temperature, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(token, logits.argmax(dim=1))


def test_limits_of_the_range():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    assert sample_next(logits, 1e-40).item() == 1  # overflowed logits / T to inf, then NaN, before
    assert sample_next(logits, 1.0, top_p=1e-46).item() == 1  # dropped every token, before
    assert sample_next(logits, 1.0, top_p=math.ulp(0.0)).item() == 1
    # a huge temperature is the uniform distribution: all three tokens come up
    seen = {sample_next(logits, 1e300, generator=torch.Generator().manual_seed(s)).item() for s in range(60)}
    assert seen == {0, 1, 2}
