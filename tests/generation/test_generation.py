"""Cached generation equals recomputation; sampling filters behave."""

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError
from txl.generation import generate, sample_next


def greedy_by_recomputation(model, prompt, n):
    seq = prompt
    for _ in range(n):
        logits = model(seq).logits[:, -1]  # whole prefix, no memory
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
    return seq


@pytest.mark.parametrize("prompt_len", [1, 4, 13])
def test_cached_greedy_equals_full_recomputation(prompt_len):
    model = tiny_model(mem_len=64, tgt_len=4)
    prompt = torch.randint(0, 37, (3, prompt_len))
    cached = generate(model, prompt, 20, temperature=0)
    assert cached.shape == (3, prompt_len + 20)
    assert torch.equal(cached, greedy_by_recomputation(model, prompt, 20))


def test_generation_feeds_one_token_per_step():
    model = tiny_model(mem_len=64, tgt_len=4)
    seen = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0].shape[1]), with_kwargs=True)
    generate(model, torch.randint(0, 37, (1, 9)), 6, temperature=0)
    handle.remove()
    assert seen == [4, 4] + [1] * 6  # prompt[:-1] primes the memory in tgt_len chunks, then one token each


def test_abs_generation_uses_sliding_window():
    model = tiny_model(attn_type="abs", tgt_len=6)
    prompt = torch.randint(0, 37, (2, 3))
    out = generate(model, prompt, 8, temperature=0)
    seq = prompt
    for _ in range(8):
        nxt = model(seq[:, -6:]).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


def test_seeded_sampling_is_reproducible_and_restores_train_mode():
    model = tiny_model(mem_len=16)
    model.train()
    prompt = torch.randint(0, 37, (2, 3))
    a = generate(model, prompt, 10, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(7))
    b = generate(model, prompt, 10, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    assert model.training


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    draws_k = {int(sample_next(logits, top_k=2, generator=g)) for _ in range(200)}
    assert draws_k == {0, 1}
    draws_p = {int(sample_next(logits, top_p=0.7, generator=g)) for _ in range(200)}
    assert draws_p == {0, 1}  # 0.5 < 0.7 so the second token is needed, the third is not
    draws_p1 = {int(sample_next(logits, top_p=0.4, generator=g)) for _ in range(50)}
    assert draws_p1 == {0}
    with pytest.raises(TxlError):
        sample_next(logits, top_p=0.0)
    with pytest.raises(TxlError):
        sample_next(logits, temperature=-1)


@pytest.mark.parametrize("overrides", [{"mem_len": 5}, {"mem_len": 5, "pre_lnorm": True, "same_length": True},
                                       {"mem_len": 0}, {"mem_len": 7, "clamp_len": 3, "untie_r": True},
                                       {"attn_type": "shaw", "shaw_max_dist": 8, "mem_len": 64},
                                       {"attn_type": "shaw", "shaw_max_dist": 8, "mem_len": 5, "same_length": True},
                                       {"attn_type": "shaw", "shaw_max_dist": 2, "mem_len": 7},
                                       {"attn_type": "rope", "mem_len": 64},
                                       {"attn_type": "rope", "mem_len": 5, "same_length": True}])
def test_decoding_caches_change_nothing_with_a_sliding_memory(overrides):
    model = tiny_model(tgt_len=4, **overrides)
    prompt = torch.randint(0, 37, (2, 9))
    ours = generate(model, prompt, 15, temperature=0)  # keys/values of the memory cached across steps
    # the same steps, the memory re-projected every time
    mems = None
    for start in range(0, 8, 4):
        mems = model(prompt[:, start:min(start + 4, 8)], mems=mems).mems
    seq, last = prompt, prompt[:, -1:]
    for _ in range(15):
        out = model(last, mems=mems)
        mems = out.mems
        last = out.logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, last], 1)
    assert torch.equal(ours, seq)


def test_vanilla_model_refuses_a_memory():
    model = tiny_model(attn_type="abs")
    with pytest.raises(TxlError, match="no memory"):
        generate(model, torch.randint(0, 37, (1, 4)), 3, temperature=0, mems=[torch.zeros(1, 2, 16)] * 3)
