"""Int8 weights (txl.kernels.int8): the products' error bounds, the model's outputs against float32, the
saved quantised checkpoint, and the --quantize flag of the inference commands."""

import copy

import pytest
import torch
from torch import nn

from tests.conftest import one_error_line, run_cli, tiny_model
from txl.errors import TxlError
from txl.fileio.model_files import int8_names
from txl.kernels.int8 import Int8Linear, int8_product, is_quantized, quantize_int8
from txl.model.transformer import TransformerXLLM


def _layer(out_features=24, in_features=40, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight[3] *= 50  # one channel far larger than the others: per-channel scales keep the rest fine
    return layer


def test_weights_round_to_their_channel_step():
    layer = _layer()
    q = Int8Linear.from_linear(layer)
    step = layer.weight.abs().amax(dim=1) / 127
    assert torch.equal(q.weight_scale, step)
    assert q.weight.dtype == torch.int8 and int(q.weight.abs().max()) == 127
    err = (q.dequantize() - layer.weight).abs()
    assert bool((err <= step[:, None] / 2 + 1e-7).all())  # nearest step of its own channel
    assert torch.equal(q.weight.abs().amax(dim=1), torch.full((24,), 127, dtype=torch.int8))  # the range used


@pytest.mark.parametrize("rows", [1, 3, 70])
def test_each_row_stays_within_its_rounding_bound(rows):
    """Each input row is rounded to its own step s = max|x_row| / 127: the product's
    error is at most s/2 * sum_i |W_ji| per output (plus float sums), and exactly zero for rows that are
    multiples of their step."""
    q = Int8Linear.from_linear(_layer(bias=False))
    x = torch.randn(rows, 40)
    x[0] = torch.randint(-127, 128, (40,)).float() * 0.25  # multiples of 0.25 ...
    x[0, 5] = 31.75  # ... whose max |x| = 127 * 0.25: its step is 0.25, and it is quantised exactly
    w = q.dequantize(torch.float64)
    exact = x.double() @ w.T
    got = q(x).double()
    step = x.abs().amax(dim=1, keepdim=True).double() / 127
    bound = step / 2 * w.abs().sum(dim=1)[None, :] + 1e-4
    assert bool(((got - exact).abs() <= bound).all())
    torch.testing.assert_close(got[0], exact[0], atol=1e-4, rtol=1e-6)
    # each row is quantised on its own: a row's result does not depend on the rows beside it
    torch.testing.assert_close(q(x)[0], q(torch.cat([x, 100 * torch.randn(4, 40)]))[0], atol=0, rtol=0)


def test_int8_layer_takes_the_calls_of_the_float_layer():
    """The hints the model gives a linear layer (a step's one-token rows, a slice of output rows, the
    memory's rows to skip) give the int8 product of those rows: the model's code does not know which
    layer it holds."""
    q = Int8Linear.from_linear(_layer())
    x = torch.randn(3, 1, 40)
    want = int8_product(x.view(3, 40), q.weight, q.weight_scale, q.bias)
    torch.testing.assert_close(q(x).view(3, 24), want, atol=0, rtol=0)  # a decoding step's rows
    torch.testing.assert_close(q(x.view(3, 40)), want, atol=0, rtol=0)
    sliced = q(x.view(3, 40), slice(4, 10))  # the queries' rows of qkv_net, as the attention takes them
    assert sliced.shape == (3, 6)
    torch.testing.assert_close(sliced, want[:, 4:10], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(q(x.view(1, 3, 40), skip_rows=2), want[None], atol=0, rtol=0)  # nothing to skip
    # float64 (the invariant tests' dtype) multiplies the dequantised weight
    x64 = torch.randn(2, 40, dtype=torch.float64)
    torch.testing.assert_close(q(x64), x64 @ q.dequantize(torch.float64).T + q.bias.double())


def _logits(model, ids, mems=None):
    with torch.no_grad():
        out = model(ids, mems=mems)
    return out.logits, out.mems


def test_a_quantised_model_stays_close_to_float32_and_keeps_its_memory():
    model = tiny_model(dtype=torch.float32, d_model=32, d_head=16, d_inner=64, vocab_size=50)
    q = quantize_int8(copy.deepcopy(model))
    assert is_quantized(q) and not is_quantized(model)
    assert all(not p.requires_grad for p in q.parameters()) and not q.training
    assert sum(isinstance(m, Int8Linear) for m in q.modules()) == 3 * 5 + 1  # 3 layers: qkv, o, r, two FF; the softmax
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (2, 20))
    ref, ref_mems = _logits(model, ids)
    got, mems = _logits(q, ids)
    assert (got - ref).abs().max() < 0.02 * ref.abs().max()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    # the memory is the float hidden states, as in the float model (close to them)
    assert all((a - b).abs().max() < 0.05 for a, b in zip(mems, ref_mems))
    nxt = torch.randint(0, 50, (2, 5))
    torch.testing.assert_close(_logits(q, nxt, mems)[0], _logits(model, nxt, ref_mems)[0], atol=0.05, rtol=0.05)


def test_quantised_greedy_decoding_matches_its_own_uncached_passes():
    """The one-token step with int8 weights computes what the int8 forward computes for that token (each
    row is quantised on its own, and the int8 sums are exact)."""
    from txl.generation import generate

    q = quantize_int8(tiny_model(dtype=torch.float32, vocab_size=40, d_model=32, d_head=16, d_inner=64, mem_len=64))
    prompt = torch.randint(0, 40, (1, 6))
    out = generate(q, prompt, max_new_tokens=8, temperature=0)
    seq = prompt
    for _ in range(8):  # no cache: the whole sequence again each time
        with torch.no_grad():
            nxt = q(seq).logits[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out[:, : seq.size(1)], seq)


def test_adaptive_softmax_with_clusters_quantised():
    model = tiny_model(dtype=torch.float32, vocab_size=60, cutoffs=[20, 40], div_val=1, d_model=32, d_head=16,
                       mem_len=32)
    q = quantize_int8(copy.deepcopy(model))
    ids = torch.randint(0, 60, (2, 9))
    with torch.no_grad():
        ref = model(ids, labels=ids).loss
        got = q(ids, labels=ids).loss
    assert abs(float(got) - float(ref)) < 0.01 * float(ref) and float(got) != float(ref)  # rounded, not far
    assert isinstance(q.crit.out_layers[0], Int8Linear)
    # each cached decoding step (its few rows read the clusters too) scores what the uncached int8 pass
    # scores for that position, and not what the float model scores
    from txl.generation.stream import generate_steps

    prompt = torch.randint(0, 60, (2, 5))
    seq = prompt
    for step in generate_steps(q, prompt, 6, temperature=0):
        with torch.no_grad():
            whole, float_whole = q(seq).logits[:, -1], model(seq).logits[:, -1]
        torch.testing.assert_close(step.logits.float(), whole, atol=1e-4, rtol=1e-4)
        assert (step.logits.float() - float_whole).abs().max() > 1e-4
        seq = torch.cat([seq, step.token[:, None]], 1)


def test_compressed_memory_trains_its_compressor_beside_int8_weights():
    """The attention-reconstruction loss (Rae et al. 2019) reads the int8 attention weights."""
    q = quantize_int8(tiny_model(dtype=torch.float32, mem_len=5, cmem_len=4, cmem_ratio=2))
    ids = torch.randint(0, 37, (2, 12))
    out = q(ids[:, :6], labels=ids[:, :6])
    out = q(ids[:, 6:], labels=ids[:, 6:], mems=out.mems)
    assert out.recon_loss is not None and bool(torch.isfinite(out.recon_loss)) and float(out.recon_loss) > 0


def test_training_an_int8_model_through_the_python_api_is_refused(tmp_path):
    from txl.evaluation.dynamic import dynamic_evaluate, gradient_statistics

    q = quantize_int8(tiny_model(dtype=torch.float32))
    tokens = torch.randint(0, 37, (40,)).numpy()
    for call in (lambda: dynamic_evaluate(q, tokens), lambda: gradient_statistics(q, tokens)):
        with pytest.raises(TxlError, match="int8 weights, which are for inference only"):
            call()


def test_an_old_torch_loads_float_checkpoints_and_refuses_int8_ones(tmp_path, monkeypatch):
    model = tiny_model(dtype=torch.float32)
    model.save_pretrained(tmp_path / "float")
    quantize_int8(copy.deepcopy(model)).save_pretrained(tmp_path / "int8")
    monkeypatch.setattr(torch, "__version__", "2.5.1+cpu")
    assert not is_quantized(TransformerXLLM.from_pretrained(tmp_path / "float"))
    with pytest.raises(TxlError, match="need torch 2.6 or later"):
        TransformerXLLM.from_pretrained(tmp_path / "int8")
    with pytest.raises(TxlError, match="need torch 2.6 or later"):
        quantize_int8(model)


def test_a_saved_quantised_model_loads_as_it_was(tmp_path):
    q = quantize_int8(tiny_model(dtype=torch.float32, tie_weight=True))
    q.save_pretrained(tmp_path / "q")
    loaded = TransformerXLLM.from_pretrained(tmp_path / "q")
    assert is_quantized(loaded)
    for name, value in q.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    ids = torch.randint(0, 37, (2, 7))
    torch.testing.assert_close(_logits(loaded, ids)[0], _logits(q, ids)[0], atol=0, rtol=0)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "q" / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        assert f.get_tensor("layers.0.attn.qkv_net.weight").dtype == torch.int8
    assert "layers.0.attn.qkv_net" in int8_names(names) and "word_emb.emb_layers.0" not in int8_names(names)


def test_a_quantised_file_with_float_in_place_of_int8_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    q = quantize_int8(tiny_model(dtype=torch.float32))
    q.save_pretrained(tmp_path / "q")
    tensors = load_file(str(tmp_path / "q" / "model.safetensors"))
    tensors["layers.0.attn.o_net.weight"] = tensors["layers.0.attn.o_net.weight"].float()
    save_file(tensors, str(tmp_path / "q" / "model.safetensors"))
    with pytest.raises(TxlError, match="o_net.weight has dtype torch.float32, not int8"):
        TransformerXLLM.from_pretrained(tmp_path / "q")


@pytest.mark.parametrize("attn_type", ["rel", "shaw", "rope", "abs"])
def test_the_reference_reads_an_int8_model_as_its_dequantised_weights(attn_type):
    """In float64 an int8 layer multiplies by its dequantised weight (no input rounding), which is what the
    plain reference (txl plot --attention) reads: the two agree to float64 rounding, for every scheme."""
    from tests.conftest import run_segments
    from txl.model import reference

    extra = {"shaw_max_dist": 11} if attn_type == "shaw" else {}
    q = quantize_int8(tiny_model(dtype=torch.float32, attn_type=attn_type, **extra)).double()
    ids = torch.randint(0, 37, (2, 12))
    got, _ = run_segments(q, ids, [5, 7])
    ref = reference.forward(q, ids, [5, 7]).logits
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


def test_old_torch_versions_are_refused():
    from txl.kernels.int8 import check_torch

    for old in ("2.2.0", "2.5.1+cpu"):
        with pytest.raises(TxlError, match="need torch 2.6 or later"):
            check_torch(old)
    for fine in ("2.6.0", "2.13.0+cpu", "3.0.0.dev20270101"):
        check_torch(fine)


def test_quantise_refuses_a_name_that_is_no_linear_layer():
    with pytest.raises(TxlError, match="not a linear layer"):
        quantize_int8(tiny_model(), ["word_emb"])


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    from tests.cli.test_cli import TINY

    root = tmp_path_factory.mktemp("int8")
    corpus = root / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    from txl.cli import main

    assert main(["train", str(corpus), "--tokenizer", "char", "--out", str(root / "run"), "-q", *TINY]) == 0
    return root / "run"


def test_the_inference_commands_take_quantize_int8(char_run, capsys, tmp_path):
    import json

    (tmp_path / "doc.txt").write_text("the lazy dog", encoding="utf-8")

    code, out, err = run_cli(capsys, "eval", char_run, "--json", "-")
    assert code == 0, err
    base = json.loads(out)
    code, out, err = run_cli(capsys, "eval", char_run, "--json", "-", "--quantize", "int8")
    assert code == 0 and "int8 weights" in err, err
    quant = json.loads(out)
    assert abs(quant["value"] - base["value"]) < 0.01 * base["value"]
    for argv in (["generate", char_run, "--prompt", "the ", "-n", "8", "--quantize", "int8", "--temperature", "0"],
                 ["score", char_run, tmp_path / "doc.txt", "--quantize", "int8"]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0 and out, err
    code, out, err = run_cli(capsys, "eval", char_run, "--json", "-", "--quantize", "bf16")
    assert code == 0 and "bf16 weights" in err, err
    assert abs(json.loads(out)["value"] - base["value"]) < 0.01 * base["value"]
    code, out, err = run_cli(capsys, "eval", char_run, "--quantize", "int4")
    assert code == 2 and "--quantize" in one_error_line(err)
    code, out, err = run_cli(capsys, "eval", char_run, "--quantize", "int8", "--dynamic")
    assert code == 2 and "drop --quantize" in one_error_line(err) and out == ""


@pytest.mark.parametrize("command", ["eval", "generate", "score", "summarize", "serve"])
def test_every_inference_command_has_the_flag(command, capsys):
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0 and "--quantize {none,int8,bf16}" in out


def test_convert_int8_writes_a_checkpoint_that_loads_as_it_is(char_run, capsys, tmp_path):
    import hashlib
    import json

    code, out, err = run_cli(capsys, "convert", "int8", char_run, tmp_path / "int8")
    assert code == 0 and "wrote" in out, err
    assert (tmp_path / "int8" / "run.json").is_file() and (tmp_path / "int8" / "vocab.json").is_file()
    state = json.loads((tmp_path / "int8" / "state.json").read_text())
    assert state["quantize"] == "int8" and state["quantized_from"].endswith("best")
    code, out, err = run_cli(capsys, "eval", tmp_path / "int8", "--json", "-")
    assert code == 0, err
    saved = json.loads(out)["value"]
    code, out, err = run_cli(capsys, "eval", char_run, "--json", "-", "--quantize", "int8")
    assert code == 0 and saved == json.loads(out)["value"], err
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "int8").rglob("*") if p.is_file()}
    (tmp_path / "docs" / "a").mkdir(parents=True)
    (tmp_path / "docs" / "b").mkdir()
    for label in "ab":
        for i in range(4):
            (tmp_path / "docs" / label / f"{i}.txt").write_text(f"the {label} quick fox " * 5 + "jumps " * i)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": "the " + "quick " * i + "fox", "completion": " dog"}) + "\n"
                             for i in range(6)))
    for argv, expect in ((["convert", "int8", tmp_path / "int8", tmp_path / "again"], "already holds int8"),
                         (["eval", tmp_path / "int8", "--quantize", "bf16"], "needs a float checkpoint"),
                         (["eval", tmp_path / "int8", "--dynamic"], "int8 weights, which are for inference only"),
                         (["finetune", "--init", tmp_path / "int8", "--data", pairs, "--out", tmp_path / "ft"],
                          "int8 weights, which are for inference only"),
                         (["classify", "train", tmp_path / "int8", "--data", tmp_path / "docs", "--out", tmp_path / "clf",
                           "--steps", "2"], "int8 weights, which are for inference only"),
                         (["convert", "int8", char_run, tmp_path / "int8"], "DST"),
                         (["convert", "to-hf", tmp_path / "int8", tmp_path / "hf"], "int8 weights")):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and expect in one_error_line(err), err
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "int8").rglob("*") if p.is_file()}
    assert after == before and not (tmp_path / "again").exists() and not (tmp_path / "hf").exists()
    code, out, err = run_cli(capsys, "plot", tmp_path / "int8", "--attention", "--text", "the quick brown fox " * 3,
                             "--out", tmp_path / "plots")
    assert code == 0 and list((tmp_path / "plots").glob("*.png")), err


def test_a_saved_quantised_checkpoint_evaluates_as_quantising_at_load(char_run, capsys, tmp_path):
    """Python API: quantise, save; txl eval then reads the int8 weights as they are (no second rounding)."""
    import json

    from txl.training.checkpoint import load_checkpoint

    ckpt = load_checkpoint(char_run)
    quantize_int8(ckpt.model).save_pretrained(tmp_path / "int8", ckpt.tokenizer)
    data, span = char_run.parent / "corpus.txt", ("--tgt-len", "8", "--mem-len", "16")
    code, out, err = run_cli(capsys, "eval", tmp_path / "int8", "--json", "-", "--data", data, *span)
    assert code == 0, err
    saved = json.loads(out)["value"]
    code, out, err = run_cli(capsys, "eval", char_run, "--json", "-", "--quantize", "int8", "--data", data, *span)
    assert code == 0, err
    assert saved == json.loads(out)["value"]


def test_the_benchmark_measures_both_models_side_by_side():
    from txl_studies.speed.quantize import quantize_table

    config = dict(vocab_size=40, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, tgt_len=8, mem_len=8)
    result = quantize_table(config, batches=(1, 2), gen_tokens=2, repeats=1, bf16=True, compiled="aot_eager",
                            log=lambda _: None)
    assert [r["batch"] for r in result["decoding"]] == [1, 2] and [r["batch"] for r in result["evaluation"]] == [1, 2]
    for row in result["decoding"] + result["evaluation"]:
        assert row["ratio"] == pytest.approx(row["int8_tokens_per_s"] / row["float32_tokens_per_s"])
        assert row["bfloat16_ratio"] == pytest.approx(row["bfloat16_tokens_per_s"] / row["float32_tokens_per_s"])
    for row in result["decoding"] + result["evaluation"]:  # int8 compiled (txl generate/eval --compile --quantize int8)
        assert row["compiled_ratio"] == pytest.approx(row["int8_compiled_tokens_per_s"] / row["float32_tokens_per_s"])
    assert all(row["compile_seconds"] > 0 for row in result["decoding"])
    # bytes a step reads: 4 per float32 weight, 1 per int8 weight plus a 4-byte scale per output channel
    linear = 2 * (32 * 96 + 32 * 32 + 32 * 64 + 64 * 32) + 32 * 40  # qkv, o, two FF per layer; the softmax
    channels = 2 * (96 + 32 + 64 + 32) + 40
    rest = result["bytes_per_step"]["float32"] - 4 * linear
    assert result["bytes_per_step"]["int8"] == rest + linear + 4 * channels
    assert result["bytes_per_step"]["bfloat16"] * 2 == result["bytes_per_step"]["float32"]


@pytest.mark.parametrize("kind", ["int8", "bf16"])
def test_a_served_session_with_quantised_weights_scores_as_the_quantised_model(kind):
    """txl serve's session (appends in pieces) gives what txl score gives with the same quantised model."""
    import httpx
    import numpy as np

    from tests.conftest import served_app
    from txl.data import ByteTokenizer
    from txl.evaluation.scoring import score_tokens
    from txl.kernels.int8 import to_bfloat16
    from txl.config import AttentionSpan
    from txl_recipes.serve.app import create_app
    from txl_recipes.serve.server import build_engine

    span, tok = AttentionSpan(tgt_len=6, mem_len=10), ByteTokenizer()
    model = tiny_model(seed=3, dtype=torch.float32, vocab_size=256, d_model=32, d_head=16, d_inner=64)
    model = quantize_int8(model) if kind == "int8" else to_bfloat16(model)
    text = "Transformer-XL reads text segment by segment; the memory carries the past.\n" * 2
    (expected,) = score_tokens(copy.deepcopy(model), [tok.encode(text)], carry_memory=True, span=span)
    engine = build_engine(model, tok, span=span, max_sessions=4, idle_timeout=300, max_tokens=5000)
    with served_app(create_app(engine, max_request_bytes=20000)) as base, httpx.Client(base_url=base, timeout=60) as c:
        sid = c.post("/v1/sessions").json()["id"]
        got = []
        for a in range(0, len(text), 17):
            reply = c.post(f"/v1/sessions/{sid}/append", json={"text": text[a:a + 17]})
            assert reply.status_code == 200, reply.text
            got += [np.nan if t["logprob"] is None else t["logprob"] for t in reply.json()["tokens"]]
        done = c.post("/v1/completions", json={"prompt": "The memory", "max_tokens": 5, "temperature": 0})
        assert done.status_code == 200, done.text
    np.testing.assert_allclose(got, expected.logprobs, atol=1e-4 if kind == "int8" else 0.05)


def test_half_weights_under_the_other_half_autocast_are_one_txl_error_in_every_reading():
    # bf16 weights under a float16 autocast reach no kernel (CPU: "mixed dtype"): refused by the model itself, so
    # the API, the server's engine and the classifier (which reads through hidden_states) all say it in one line
    from txl.evaluation.stream import evaluate
    from txl.kernels.int8 import to_bfloat16

    model = to_bfloat16(tiny_model(dtype=torch.float32))
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(TxlError, match="bfloat16 weights cannot run with torch.autocast to float16: bfloat16 "
                                           "weights compute in bfloat16; autocast to bfloat16, or not at all"):
            model(ids)
        with pytest.raises(TxlError, match="bfloat16 weights cannot run with torch.autocast to float16"):
            model.hidden_states(ids)
    with pytest.raises(TxlError, match="bfloat16 weights cannot run with torch.autocast to float16"):
        evaluate(model, ids.flatten().numpy(), tgt_len=4, mem_len=4, batch_size=1, dtype="float16")
    half = tiny_model(dtype=torch.float16)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TxlError, match="float16 weights cannot run"):
        half(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # their own dtype runs
        assert model(ids).logits.shape == (2, 9, 37)
