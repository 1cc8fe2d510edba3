"""The CPU dropout: right keep rate, unbiased, exact gradient, reproducible, dtype kept."""

import pytest
import torch

from txl.kernels.cpu import Dropout, keep_mask


@pytest.mark.parametrize("p", [0.05, 0.1, 0.3, 0.5, 0.9, 0.999999])
def test_keep_rate_per_lane_matches_one_minus_p(p):
    mask = keep_mask((1_000_003,), p, generator=torch.Generator().manual_seed(0))
    assert mask.shape == (1_000_003,) and mask.dtype == torch.bool
    lanes = mask[:1_000_000].view(-1, 4).double().mean(0)
    # binomial standard error per lane: sqrt(p(1-p)/250000) <= 0.001; quantisation <= 2^-15
    assert (lanes - (1 - p)).abs().max() < 0.005, lanes


def test_training_output_is_unbiased_and_the_gradient_is_the_mask():
    torch.manual_seed(0)
    drop = Dropout(0.2).train()
    x = torch.rand(64, 128, 32, dtype=torch.float64) + 1.0
    x.requires_grad_(True)
    y = drop(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.8)
    assert abs(kept.double().mean().item() - 0.8) < 0.01
    assert abs(y.mean().item() / x.mean().item() - 1.0) < 0.01
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.double() / 0.8)


def test_eval_mode_p0_p1_seed_and_dtype():
    x = torch.randn(3, 5, 7)
    assert Dropout(0.3).eval()(x) is x and Dropout(0.0).train()(x) is x
    x.requires_grad_(True)
    dropped = Dropout(1.0).train()(x)
    assert not dropped.any() and dropped.requires_grad
    x = x.detach()
    torch.manual_seed(5)
    a = Dropout(0.3).train()(x)
    torch.manual_seed(5)
    b = Dropout(0.3).train()(x)
    assert torch.equal(a, b)
    assert Dropout(0.3).train()(x.to(torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        Dropout(1.5)
