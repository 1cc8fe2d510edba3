"""Beam search with the memory reordered per beam, and prompts of different lengths decoded together."""

import itertools
import json

import pytest
import torch

from conftest import one_error_line, run_cli, tiny_model
from txl.data import ByteTokenizer
from txl.generation import DecodingRules, beam_search, generate, prime_memory, prime_rows
from txl.kernels import cpu
from txl.model.decoding import DecodingState
from txl.training.checkpoint import save_checkpoint
from txl.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def logprob(model, prompt, tokens):
    """Brute force: log p(tokens | prompt) from one forward over the whole sequence (no memory, no cache)."""
    seq = torch.cat([prompt[0], torch.as_tensor(tokens, dtype=torch.long)])[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(seq[:, :-1]).logits.double(), -1)[0]
    return float(sum(logp[prompt.size(1) - 1 + i, t] for i, t in enumerate(tokens)))


@pytest.mark.parametrize("overrides", [{}, {"mem_len": 5, "same_length": True}, {"attn_type": "shaw", "shaw_max_dist": 4},
                                       {"attn_type": "rope"}])
def test_beam_search_scores_its_sequence_and_never_loses_to_greedy(overrides):
    model = tiny_model(tgt_len=4, **{"mem_len": 64, **overrides})
    differ = 0
    for seed in range(4):
        prompt = torch.randint(0, 37, (1, 7), generator=torch.Generator().manual_seed(seed))
        greedy = generate(model, prompt, 8, temperature=0)[0, 7:].tolist()
        assert beam_search(model, prompt, 1, 8).tokens.tolist() == greedy  # num_beams=1 is greedy
        beam = beam_search(model, prompt, 4, 8)
        if overrides.get("mem_len", 64) >= 15:  # the memory holds everything: one forward is the reference
            # the returned log-prob is that of the sequence: memory and caches followed their beams
            assert beam.logprob == pytest.approx(logprob(model, prompt, beam.tokens.tolist()), abs=1e-10)
            assert beam.logprob >= logprob(model, prompt, greedy) - 1e-10
        greedy_score = beam_search(model, prompt, 1, 8).score
        assert beam.score >= greedy_score - 1e-12  # in the model's own (memory-limited) scores too (float64 rounding)
        differ += beam.tokens.tolist() != greedy
    assert differ  # on this model beam search finds other (better) sequences than greedy


def test_wide_beams_find_the_best_sequence_by_exhaustive_search():
    model = tiny_model(vocab_size=4, tgt_len=3, mem_len=16)
    for seed in range(3):
        prompt = torch.randint(0, 4, (1, 5), generator=torch.Generator().manual_seed(seed))
        best = max(itertools.product(range(4), repeat=3), key=lambda seq: logprob(model, prompt, list(seq)))
        result = beam_search(model, prompt, 16, 3)  # 16 beams keep every prefix of 2 tokens
        assert result.tokens.tolist() == list(best)
        assert result.logprob == pytest.approx(logprob(model, prompt, list(best)), abs=1e-10)


def test_beam_search_sets_finished_hypotheses_aside_at_the_end_token():
    model = tiny_model(tgt_len=4, mem_len=32)
    with torch.no_grad():
        model.crit.out_layers[0].bias[3] = 2.0  # token 3 ends: likely, but not certain
    prompt = torch.randint(0, 37, (1, 5), generator=torch.Generator().manual_seed(1))
    for penalty in (0.0, 1.0, 2.0):
        result = beam_search(model, prompt, 3, 12, end_ids=[3], length_penalty=penalty)
        tokens = result.tokens.tolist()
        assert 3 not in tokens[:-1]
        if tokens and tokens[-1] == 3:
            assert result.score == pytest.approx(result.logprob / len(tokens) ** penalty, abs=1e-10)
    assert beam_search(model, prompt, 3, 12, end_ids=[3], rules=DecodingRules(min_new_tokens=5)).tokens.tolist()[:5].count(3) == 0


@pytest.mark.parametrize("overrides", [{"mem_len": 6}, {"mem_len": 64}, {"mem_len": 6, "same_length": True, "clamp_len": 3},
                                       {"attn_type": "shaw", "shaw_max_dist": 3, "mem_len": 6},
                                       {"attn_type": "rope", "mem_len": 6, "same_length": True}])
@pytest.mark.parametrize("tiny_blocks", [False, True])
def test_padded_memories_give_each_row_its_own_logits(overrides, tiny_blocks, monkeypatch):
    """Model level: rows primed alone, left-padded to one memory, read together = each row alone
    (also with the padded attention taken one head of one row at a time)."""
    if tiny_blocks:
        monkeypatch.setattr(cpu, "BLOCK_BYTES", 16)
    model = tiny_model(tgt_len=4, **overrides)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 37, (n,), generator=gen) for n in (1, 3, 9, 14)]
    span = model.config.span
    steps = torch.randint(0, 37, (len(prompts), 10), generator=gen)  # teacher-forced next tokens
    with torch.no_grad():
        for cached in (False, True):  # the general path, and the ring-buffer steps
            mems, padding = prime_rows(model, prompts, span)
            state = DecodingState(model.config.n_layer, span) if cached else None
            last = torch.stack([p[-1:] for p in prompts])
            batch = []
            for t in range(steps.size(1)):
                before = state.memory_length if cached and state.length else mems[0].size(1)
                out = model(last, mems=mems, caches=state, mem_padding=padding)
                after = state.memory_length if cached else out.mems[0].size(1)
                padding = (padding - (before + 1 - after)).clamp(min=0)
                mems, last = out.mems, steps[:, t:t + 1]
                batch.append(out.logits[:, -1])
            for b, p in enumerate(prompts):
                state = DecodingState(model.config.n_layer, span)
                m = prime_memory(model, p[None, :-1], None, state)
                x = p[None, -1:]
                for t in range(steps.size(1)):
                    out = model(x, mems=m, caches=state)
                    m, x = None, steps[b:b + 1, t:t + 1]
                    assert torch.allclose(out.logits[0, -1], batch[t][b], rtol=0, atol=1e-10), (cached, b, t)


@pytest.mark.parametrize("overrides", [{"mem_len": 5}, {"attn_type": "abs"}, {"attn_type": "rope", "mem_len": 5}])
def test_prompts_of_different_lengths_decode_as_each_alone(overrides):
    model = tiny_model(tgt_len=4, **overrides)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 37, (n,), generator=gen) for n in (2, 11, 1, 6)]
    together = generate(model, prompts, 12, temperature=0)
    for p, row in zip(prompts, together):
        assert row.tolist() == generate(model, p[None], 12, temperature=0)[0].tolist()
    seeds = [torch.Generator().manual_seed(10 + i) for i in range(4)]
    together = generate(model, prompts, 12, temperature=1.0, top_k=10, generator=seeds)
    for i, (p, row) in enumerate(zip(prompts, together)):
        alone = generate(model, p[None], 12, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(10 + i))
        assert row.tolist() == alone[0].tolist()


def test_cli_input_file_and_beams(tmp_path, capsys):
    model = tiny_model(vocab_size=256, mem_len=16, tgt_len=4, dtype=torch.float32)
    save_checkpoint(tmp_path / "ckpt", model, ByteTokenizer(), RunConfig(model=model.config), {"step": 1})
    prompts = ["a", "hello there", "xyz" * 7]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    outs = []
    for batch in ("1", "3"):
        code, out, err = run_cli(capsys, "generate", tmp_path / "ckpt", "--input", tmp_path / "p.jsonl", "-n", "8",
                                 "--seed", "5", "--batch-size", batch)
        assert code == 0, err
        outs.append([json.loads(line) for line in out.splitlines()])
    assert outs[0] == outs[1] and [o["prompt"] for o in outs[0]] == prompts  # batching changes nothing
    code, out, err = run_cli(capsys, "generate", tmp_path / "ckpt", "--prompt", "ab", "-n", "6", "--num-beams", "3")
    assert code == 0 and out.startswith("ab")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n')
    code, out, err = run_cli(capsys, "generate", tmp_path / "ckpt", "--input", tmp_path / "bad.jsonl")
    assert code == 2 and 'line 1 must be a JSON object with a non-empty "prompt"' in one_error_line(err)
