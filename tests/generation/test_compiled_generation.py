"""Compiled decoding (``generate(..., compile=...)``, ``txl generate --compile``): the ring modules of
txl.model.graphs (run by txl.generation.compiled) under torch.compile give the default path's tokens,
with one graph per module for every memory fill. The aot_eager backend traces exactly what inductor
would compile, without the C++ build; inductor itself is in a slow test."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from conftest import one_error_line, run_cli, tiny_model
from txl.errors import TxlError
from txl.generation import generate


@pytest.mark.parametrize("overrides", [dict(), dict(same_length=True, clamp_len=3), dict(attn_type="shaw", shaw_max_dist=6),
                                       dict(cutoffs=[10, 20], div_val=2, d_embed=16)],
                         ids=["default", "same_length-clamp_len", "shaw", "adaptive"])
def test_compiled_generation_equals_the_default_path(overrides):
    model = tiny_model(**overrides)  # float64: sampled draws cannot differ by rounding
    ids = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(3))
    want = generate(model, ids, 30, temperature=0)
    assert torch.equal(generate(model, ids, 30, temperature=0, compile="aot_eager"), want)
    sampled = [generate(model, ids, 30, temperature=1.0, top_p=0.9, generator=torch.Generator().manual_seed(5), **kw)
               for kw in ({}, {"compile": "aot_eager"})]
    assert torch.equal(*sampled)


@pytest.mark.parametrize("batch,length", [(2, 1), (2, 20), (1, 20)])
def test_one_step_graph_for_every_memory_fill(batch, length):
    # 40 steps past a ring of 8 slots: the memory fills, then rotates, and nothing is compiled again (the
    # prompt is read by the model's own forward; only the step is compiled)
    graphs = 1
    model = tiny_model(dtype=torch.float32)
    ids = torch.randint(0, 37, (batch, length), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    counters.clear()
    out = generate(model, ids, 40, temperature=0, compile="aot_eager")
    assert counters["stats"]["unique_graphs"] == graphs
    assert torch.equal(out, generate(model, ids, 40, temperature=0))
    # a second call, and another model of the same shape, reuse the graphs
    generate(tiny_model(seed=5, dtype=torch.float32), ids, 10, temperature=0, compile="aot_eager")
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("batch,length", [(1, 13), (3, 20)])
def test_compiled_int8_generation_equals_the_int8_default_path(batch, length):
    # int8 weights (the products of txl.kernels.int8.int8_product) compile with the step: the tokens of the
    # eager int8 loop, one step graph while the ring of 8 slots fills and rotates
    from txl.kernels.int8 import quantize_int8

    model = quantize_int8(tiny_model(dtype=torch.float32))
    ids = torch.randint(0, 37, (batch, length), generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    counters.clear()
    out = generate(model, ids, 40, temperature=0, compile="aot_eager")
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(out, generate(model, ids, 40, temperature=0))


@pytest.mark.parametrize("memory", [3, 7, 12, 0], ids=["shorter", "full", "longer", "empty"])
def test_compiled_generation_after_a_given_memory(memory):
    # a txl serve session's memory (shorter than mem_len while it fills), then its tail and new tokens
    model = tiny_model()
    ids = torch.randint(0, 37, (2, 30), generator=torch.Generator().manual_seed(4))
    mems = model(ids[:, :memory]).mems if memory else [torch.zeros(2, 0, 16, dtype=torch.float64)] * 3
    if memory > 7:  # a longer memory than the span keeps: its last mem_len positions
        first = model(ids[:, :5])
        mems = [torch.cat([a, b], dim=1) for a, b in zip(first.mems, model(ids[:, 5:memory], mems=first.mems).mems)]
        assert mems[0].size(1) > 7
    for tail in (1, 4, 13):
        prompt = ids[:, memory:memory + tail]
        want = generate(model, prompt, 20, temperature=0, mems=mems)
        assert torch.equal(generate(model, prompt, 20, temperature=0, mems=mems, compile="aot_eager"), want), tail


def test_no_new_token_compiles_nothing():
    model = tiny_model(dtype=torch.float32)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    counters.clear()
    assert torch.equal(generate(model, ids, 0, temperature=0, compile="aot_eager"), generate(model, ids, 0, temperature=0))
    assert counters["stats"]["unique_graphs"] == 0


def test_compiled_generation_with_a_memory_shorter_than_the_segment():
    # the prompt is read by the model's forward, so a memory shorter than tgt_len is served as by the default path
    model = tiny_model(dtype=torch.float32)
    ids = torch.randint(0, 37, (2, 11), generator=torch.Generator().manual_seed(3))
    got = generate(model, ids, 12, temperature=0, compile="aot_eager", mem_len=3)
    assert torch.equal(got, generate(model, ids, 12, temperature=0, mem_len=3))


def test_compiled_generation_refuses_what_the_ring_cannot_hold():
    model = tiny_model()
    with pytest.raises(TxlError, match="compiled decoding takes prompts of one length"):
        generate(model, [torch.tensor([1, 2, 3]), torch.tensor([4])], 3, temperature=0, compile="aot_eager")
    with pytest.raises(TxlError, match="compiled decoding serves attn_type 'rel' and 'shaw'"):
        generate(tiny_model(attn_type="rope"), torch.tensor([[1, 2]]), 3, temperature=0, compile="aot_eager")
    with pytest.raises(TxlError, match="compile takes True or one of inductor, aot_eager, eager"):
        generate(model, torch.tensor([[1, 2]]), 3, temperature=0, compile="cudagraphs")
    with pytest.raises(TxlError, match="float32, float64 or int8 weights without autocast"):
        generate(tiny_model(dtype=torch.bfloat16), torch.tensor([[1, 2]]), 3, temperature=0, compile="aot_eager")
    with pytest.raises(TxlError, match="without autocast"), torch.autocast("cpu", dtype=torch.bfloat16):
        generate(tiny_model(dtype=torch.float32), torch.tensor([[1, 2]]), 3, temperature=0, compile="aot_eager")


def test_txl_generate_compile_refusals_are_one_line(tmp_path, capsys):
    from txl.data import ByteTokenizer
    from txl.training.checkpoint import save_checkpoint
    from txl.config import RunConfig

    tokenizer = ByteTokenizer()
    save_checkpoint(tmp_path / "ckpt", tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size, n_layer=1),
                    tokenizer, RunConfig(), {"step": 1})
    for extra, message in ((("--num-beams", "2"), "--compile does not take --num-beams yet"),
                           (("--quantize", "bf16"), "--compile does not take --quantize bf16 yet"),
                           (("--dtype", "bfloat16"), "--compile does not take a half-precision --dtype yet")):
        code, out, err = run_cli(capsys, "generate", tmp_path / "ckpt", "--compile", "-p", "ab", "-n", "2", *extra)
        assert code == 2 and message in one_error_line(err) and out == "", (extra, err)


@pytest.mark.slow
@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_inductor_compiled_generation_equals_eager(int8):
    # inductor's C++ build (a minute or more): the same greedy tokens as the default path, with 4 layers
    # (where inductor's in-place buffers got the prompt reader wrong: txl.runtime.INDUCTOR_OPTIONS)
    from txl.kernels.int8 import quantize_int8

    model = tiny_model(dtype=torch.float32, n_layer=4)
    model = quantize_int8(model) if int8 else model
    ids = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    assert torch.equal(generate(model, ids, 20, temperature=0, compile=True), generate(model, ids, 20, temperature=0))


def test_txl_generate_compile_with_int8_weights(tmp_path, capsys, monkeypatch):
    # --compile --quantize int8 passes the command's checks and prints what --quantize int8 prints
    # (aot_eager in place of inductor: the same graphs without the C++ build)
    import txl.generation.compiled as ring
    from txl.data import ByteTokenizer
    from txl.runtime import compile_module
    from txl.training.checkpoint import save_checkpoint
    from txl.config import RunConfig

    monkeypatch.setattr(ring, "compile_module", lambda module, **kw: compile_module(module, **{**kw, "backend": "aot_eager"}))
    tokenizer = ByteTokenizer()
    save_checkpoint(tmp_path / "ckpt", tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size, n_layer=4),
                    tokenizer, RunConfig(), {"step": 1})
    outs = []
    for extra in ((), ("--compile",)):
        code, out, err = run_cli(capsys, "generate", tmp_path / "ckpt", "-p", "ab", "-n", "12", "--temperature", "0",
                                 "--quantize", "int8", *extra)
        assert code == 0, err
        outs.append(out)
    assert outs[0] == outs[1] and len(outs[0]) > len("ab")
