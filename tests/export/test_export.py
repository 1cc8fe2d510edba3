"""The exported decoder: its two graphs equal txl's own decoding (eager, then exported to .pt2 and ONNX and
run by the runner), batch rows stay independent, and bad models, spans, folders and manifests are refused."""

import json

import numpy as np
import pytest
import torch

from conftest import one_error_line, tiny_model
from txl.errors import TxlError
from txl_recipes.export.files import export_decoder
from txl.model.graphs import RingStep, check_exportable, ring_capacity
from txl_recipes.export.reader import SegmentReader
from txl_recipes.export.runner import ExportedDecoder
from txl.generation import generate
from txl.config import resolve_span

CONFIGS = [dict(), dict(same_length=True), dict(clamp_len=3), dict(pre_lnorm=True, untie_r=True),
           dict(attn_type="shaw", shaw_max_dist=6), dict(cutoffs=[10, 20], div_val=2, d_embed=16),
           dict(mem_len=5, tgt_len=5)]


def greedy_with_graphs(model, span, ids, n_new, segment=None, step=None):
    """Greedy tokens [B, T + n_new] from the two graph modules run eagerly, with the runner's protocol."""
    segment = segment or SegmentReader(model, span)
    step = step or RingStep(model, span)
    c = model.config
    bsz, dtype, capacity = ids.size(0), model.word_emb.emb_layers[0].weight.dtype, ring_capacity(span)
    mems = torch.zeros(c.n_layer, bsz, span.mem_len, c.d_model, dtype=dtype)
    padding = torch.full((bsz,), span.mem_len)
    keys = torch.zeros(c.n_layer, bsz, c.n_head, capacity, c.d_head, dtype=dtype)
    values, fill = keys.clone(), torch.tensor(0)
    prime = ids[:, :-1]
    for start in range(0, prime.size(1), span.tgt_len):
        chunk = prime[:, start:start + span.tgt_len]
        n = chunk.size(1)
        chunk = torch.cat([chunk, chunk.new_zeros(bsz, span.tgt_len - n)], dim=1)
        mems, padding, keys, values, fill = segment(chunk, mems, padding, torch.tensor(n))
    write, last, out = fill % capacity, ids[:, -1:], [ids]
    for _ in range(n_new):
        logits, k, v = step(last, keys, values, write, fill)
        keys[:, :, :, write], values[:, :, :, write] = k, v
        write, fill = (write + 1) % capacity, torch.clamp(fill + 1, max=capacity)
        last = logits.argmax(-1, keepdim=True)
        out.append(last)
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_graphs_decode_as_generate(overrides):
    # prompts shorter than a segment, of one and two segments, and longer than the memory (the ring rotates
    # while priming and again while decoding: 20 new tokens past a capacity of 6-8 slots)
    model = tiny_model(**overrides)
    span = resolve_span(model.config)
    torch.manual_seed(1)
    for length in (1, 2, span.tgt_len, span.tgt_len + 1, 3 * span.tgt_len + 2):
        ids = torch.randint(0, model.config.vocab_size, (3, length))
        with torch.no_grad():
            got = greedy_with_graphs(model, span, ids, 20)
        assert torch.equal(got, generate(model, ids, 20, temperature=0)), length


def test_graphs_with_a_longer_memory_than_training():
    model = tiny_model()
    span = resolve_span(model.config, mem_len=12, tgt_len=4)
    ids = torch.randint(0, 37, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = greedy_with_graphs(model, span, ids, 25)
    assert torch.equal(got, generate(model, ids, 25, temperature=0, span=span))


def test_step_logits_equal_the_models_own_step():
    # not only the argmax: the step graph's logits are those of the model's ring-buffer step (float64)
    from txl.generation.stream import generate_steps

    model = tiny_model()
    span = resolve_span(model.config)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(4))
    want = [s.logits for s in generate_steps(model, ids, 12, temperature=0)]
    segment, step = SegmentReader(model, span), RingStep(model, span)
    got = []
    original = step.forward

    def record(*args):
        out = original(*args)
        got.append(out[0])
        return out
    step.forward = record
    with torch.no_grad():
        greedy_with_graphs(model, span, ids, 12, segment, step)
    assert len(got) == 12
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_rows_are_independent_in_the_step():
    # one row's token and state change; the other rows' logits do not move by a single bit
    model = tiny_model()
    span = resolve_span(model.config)
    step = RingStep(model, span)
    c, capacity = model.config, ring_capacity(span)
    g = torch.Generator().manual_seed(5)
    keys = torch.randn(c.n_layer, 3, c.n_head, capacity, c.d_head, generator=g, dtype=torch.float64)
    values = torch.randn(keys.shape, generator=g, dtype=torch.float64)
    ids = torch.tensor([[3], [4], [5]])
    with torch.no_grad():
        before = step(ids, keys, values, torch.tensor(2), torch.tensor(capacity))[0]
        keys[:, 0] += 1.0
        after = step(torch.tensor([[9], [4], [5]]), keys, values, torch.tensor(2), torch.tensor(capacity))[0]
    assert not torch.equal(before[0], after[0])
    assert torch.equal(before[1:], after[1:])


@pytest.mark.parametrize("overrides,message", [
    (dict(attn_type="abs", mem_len=0), "attn_type 'rel' and 'shaw'"),
    (dict(attn_type="rope"), "attn_type 'rel' and 'shaw'"),
    (dict(cmem_len=4, cmem_ratio=2), "compressed memory"),
    (dict(mem_len=3, tgt_len=5), "mem_len >= tgt_len"),
])
def test_what_cannot_be_exported_is_refused(overrides, message):
    model = tiny_model(**overrides)
    with pytest.raises(TxlError, match=message):
        check_exportable(model.config, resolve_span(model.config))


# --- exported graphs, run by the runner --------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A float32 tiny model and its export in both formats (one export each for the tests below)."""
    model = tiny_model(dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    root = tmp_path_factory.mktemp("export")
    vocab = root / "vocab.json"
    vocab.write_text("{}")
    folders = {}
    for fmt in ("pt2", "onnx"):
        folders[fmt] = root / fmt
        export_decoder(model, vocab, folders[fmt], resolve_span(model.config), fmt)
    return model, before, folders


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_exported_decoder_equals_generate_at_batch_1_and_3(exported, fmt):
    model, _, folders = exported
    decoder = ExportedDecoder(folders[fmt])
    g = torch.Generator().manual_seed(6)
    for bsz, length in ((1, 1), (1, 12), (3, 4), (3, 17)):
        ids = torch.randint(0, 37, (bsz, length), generator=g)
        want = generate(model, ids, 16, temperature=0)
        assert np.array_equal(decoder.greedy(ids.numpy(), 16), want.numpy()), (bsz, length)


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_exported_step_keeps_rows_independent(exported, fmt):
    # the failure of ONNX graphs with as_strided: a row's logits moving when another row's input changes
    _, _, folders = exported
    decoder = ExportedDecoder(folders[fmt])
    ids = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16], [2, 4, 6, 8, 10, 12, 14, 16]])
    first = decoder.step(decoder.read_prompt(ids))
    ids[0] = [30, 31, 32, 33, 34, 35, 36, 0]
    second = decoder.step(decoder.read_prompt(ids))
    assert not np.array_equal(first[0], second[0])
    assert np.array_equal(first[1:], second[1:])


def test_export_leaves_the_model_as_it_was(exported):
    model, before, folders = exported
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    manifest = json.loads((folders["onnx"] / "export.json").read_text())
    assert manifest["span"]["mem_len"] == 7 and manifest["capacity"] == 8 and manifest["format"] == "onnx"
    assert sorted(p.name for p in folders["onnx"].iterdir() if not p.name.startswith(".")) == [
        "export.json", "segment.onnx", "segment.onnx.data", "step.onnx", "step.onnx.data", "vocab.json"]
    # the weights readable as the graphs are (the exporter writes its .onnx.data files for their owner only)
    assert len({p.stat().st_mode for p in folders["onnx"].iterdir()}) == 1


def test_export_refuses_a_folder_with_files_and_an_int8_model(tmp_path):
    from txl.kernels.int8 import quantize_int8

    model = tiny_model(dtype=torch.float32)
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(TxlError, match="not empty"):
        export_decoder(model, vocab, out, resolve_span(model.config), "pt2")
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    with pytest.raises(TxlError, match="--format must be one of"):
        export_decoder(model, vocab, tmp_path / "new", resolve_span(model.config), "tflite")
    with pytest.raises(TxlError, match="int8"):
        export_decoder(quantize_int8(model), vocab, tmp_path / "new", resolve_span(model.config), "pt2")
    with pytest.raises(TxlError, match="float64 weights are not exported"):
        export_decoder(tiny_model(), vocab, tmp_path / "new", resolve_span(model.config), "pt2")
    with pytest.raises(TxlError, match="is missing: the exported decoder needs"):
        export_decoder(tiny_model(dtype=torch.float32), tmp_path / "none.json", tmp_path / "new",
                       resolve_span(model.config), "pt2")
    assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())


def test_runner_refuses_bad_folders_and_inputs(exported, tmp_path):
    _, _, folders = exported
    with pytest.raises(TxlError, match="no export.json"):
        ExportedDecoder(tmp_path)
    (tmp_path / "export.json").write_text(json.dumps({"format": "onnx"}))
    with pytest.raises(TxlError, match="bad or missing: capacity, n_layer"):
        ExportedDecoder(tmp_path)
    manifest = json.loads((folders["onnx"] / "export.json").read_text())
    (tmp_path / "export.json").write_text(json.dumps({**manifest, "capacity": "8", "span": None}))
    with pytest.raises(TxlError, match="bad or missing: capacity, span"):
        ExportedDecoder(tmp_path)
    manifest["graphs"]["step"] = "../../etc/hostname"
    (tmp_path / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(TxlError, match="refusing to read it"):
        ExportedDecoder(tmp_path)
    # a graph ONNX Runtime cannot read: one line, not its own exception
    manifest["graphs"]["step"] = "step.onnx"
    (tmp_path / "export.json").write_text(json.dumps(manifest))
    (tmp_path / "segment.onnx").write_bytes((folders["onnx"] / "segment.onnx").read_bytes()[:500])
    (tmp_path / "step.onnx").write_bytes(b"not a graph")
    with pytest.raises(TxlError, match="ONNX Runtime cannot open the graphs"):
        ExportedDecoder(tmp_path)
    decoder = ExportedDecoder(folders["onnx"])
    with pytest.raises(TxlError, match="token ids must be in"):
        decoder.greedy(np.array([[1, 99]]), 2)
    with pytest.raises(TxlError, match=r"\[batch, length\]"):
        decoder.greedy(np.array([1, 2]), 2)
    with pytest.raises(TxlError, match="max_new_tokens must be an integer >= 0"):
        decoder.greedy(np.array([[1, 2]]), -1)


def test_a_pt2_archive_with_other_entries_is_not_loaded(exported, tmp_path):
    # a .pt2 may carry pickled objects or a compiled library that torch.export.load would run: refused by name
    import shutil
    import zipfile

    _, _, folders = exported
    shutil.copytree(folders["pt2"], tmp_path / "pt2")
    with zipfile.ZipFile(tmp_path / "pt2" / "step.pt2", "a") as archive:
        archive.writestr("step/data/aotinductor/model/evil.so", b"\x7fELF")
    with pytest.raises(TxlError, match="holds 'step/data/aotinductor/model/evil.so', which is not what txl export"):
        ExportedDecoder(tmp_path / "pt2")
    # entries of the right names whose JSON would make the loader evaluate text or unpickle a tensor
    for member, old, new in [("segment/models/model.json", "Symbol('s", "__import__('os').system('true') or Symbol('s"),
                             ("segment/data/weights/model_weights_config.json", '"use_pickle": false',
                              '"use_pickle": true')]:
        with zipfile.ZipFile(folders["pt2"] / "segment.pt2") as archive:
            entries = {n: archive.read(n) for n in archive.namelist()}
        text = entries[member].decode()
        assert old in text
        entries[member] = text.replace(old, new, 1).encode()
        with zipfile.ZipFile(tmp_path / "pt2" / "segment.pt2", "w") as archive:
            for name, data in entries.items():
                archive.writestr(name, data)
        with pytest.raises(TxlError, match="the shape expression|a pickled tensor"):
            ExportedDecoder(tmp_path / "pt2")
    (tmp_path / "pt2" / "segment.pt2").write_bytes(b"not a zip")
    with pytest.raises(TxlError, match="is not a .pt2 archive"):
        ExportedDecoder(tmp_path / "pt2")


@pytest.mark.parametrize("overrides", [dict(same_length=True, clamp_len=3), dict(attn_type="shaw", shaw_max_dist=6),
                                       dict(cutoffs=[10, 20], div_val=2, d_embed=16)],
                         ids=["same_length-clamp_len", "shaw", "adaptive"])
def test_exported_pt2_of_other_configurations_equals_generate(overrides, tmp_path):
    # the traced paths (the gather rel-shift, the masked adaptive clusters, F.linear for few rows) exported
    model = tiny_model(dtype=torch.float32, **overrides)
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    export_decoder(model, vocab, tmp_path / "out", resolve_span(model.config), "pt2")
    decoder = ExportedDecoder(tmp_path / "out")
    ids = torch.randint(0, 37, (2, 13), generator=torch.Generator().manual_seed(7))
    assert np.array_equal(decoder.greedy(ids.numpy(), 16), generate(model, ids, 16, temperature=0).numpy())


# --- the command line ------------------------------------------------------------------------------

def test_txl_export_and_the_runner_from_the_command_line(tmp_path, capsys):
    from conftest import one_error_line, run_cli
    from txl.data import ByteTokenizer
    from txl_recipes.export.runner import main as runner_main
    from txl.training.checkpoint import load_checkpoint, save_checkpoint
    from txl.config import RunConfig

    tokenizer = ByteTokenizer()
    model = tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size, n_layer=2)
    save_checkpoint(tmp_path / "ckpt", model, tokenizer, RunConfig(), {"step": 1})
    code, out, err = run_cli(capsys, "export", tmp_path / "ckpt", tmp_path / "out", "--format", "pt2", "--mem-len", "9")
    assert code == 0, err
    assert "mem_len 9, 10 slots per layer" in out
    assert json.loads((tmp_path / "out" / "export.json").read_text())["span"]["mem_len"] == 9
    # the runner prints the prompt and its greedy continuation, as txl's own greedy decoding gives it
    assert runner_main([str(tmp_path / "out"), "ROMEO: ", "-n", "12"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    ckpt = load_checkpoint(tmp_path / "ckpt")
    ids = torch.as_tensor(np.asarray(tokenizer.encode("ROMEO: "), np.int64))[None]
    want = generate(ckpt.model, ids, 12, temperature=0, mem_len=9)
    assert printed == tokenizer.decode(want[0].tolist())
    # bad inputs: one line, exit status 2, the folder written before left as it is
    from txl.kernels.int8 import quantize_int8

    save_checkpoint(tmp_path / "int8", quantize_int8(tiny_model(dtype=torch.float32, vocab_size=tokenizer.vocab_size)),
                    tokenizer, RunConfig(), {"step": 1})
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    for argv, message in [
        (("export", tmp_path / "ckpt", tmp_path / "out", "--format", "pt2"), "not empty"),
        (("export", tmp_path / "ckpt", tmp_path / "o2", "--mem-len", "4", "--tgt-len", "8"), "mem_len >= tgt_len"),
        (("export", tmp_path / "nowhere", tmp_path / "o3"), "nowhere"),
        (("export", tmp_path / "ckpt", tmp_path / "o4", "--mem-len", "0"), "--mem-len"),
        (("export", tmp_path / "int8", tmp_path / "o5"), "export takes a float32 model"),
        (("export", tmp_path / "ckpt", tmp_path / "o6", "--format", "pt2", "--quantize", "int8"),
         "--quantize int8 is for --format onnx"),
    ]:
        code, _, err = run_cli(capsys, *argv)
        assert code == 2 and message in one_error_line(err), (argv, err)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    assert not any((tmp_path / "o2").glob("*")) if (tmp_path / "o2").exists() else True
    code, out, err = run_cli(capsys, "export", tmp_path / "ckpt", tmp_path / "q8", "--quantize", "int8")
    assert code == 0 and "int8 products: 9 in the step" in out, err  # 2 layers x 4 + the output layer
    assert runner_main([str(tmp_path / "q8"), "ROMEO: ", "-n", "12"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO: ")
    assert runner_main([str(tmp_path / "nowhere"), "x"]) == 2
    assert "nowhere does not exist" in one_error_line(capsys.readouterr().err)


# --- the int8 variant ------------------------------------------------------------------------------

def test_int8_export_makes_every_step_product_int8_and_keeps_the_tokens(exported, tmp_path):
    import onnx

    model, _, folders = exported  # its float32 ONNX export, and now the int8 one
    vocab = tmp_path / "vocab.json"
    vocab.write_text("{}")
    span = resolve_span(model.config)
    manifest = export_decoder(model, vocab, tmp_path / "int8", span, "onnx", quantize="int8")
    # 3 layers x (qkv, o, two feed-forward) + the output layer; the prompt reader's products on sliced
    # weights (qkv split in queries and keys/values) stay float
    assert manifest["weights"] == "int8" and manifest["int8_products"]["step"] == 13
    graph = onnx.load(str(tmp_path / "int8" / "step.onnx")).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMulInteger") == 13 and "Gemm" not in ops
    # the float products left are the attention's: over activations, or a layer's distance table [H, D, S]
    tables = {i.name: list(i.dims) for i in graph.initializer}
    constants = [tables[name] for n in graph.node if n.op_type == "MatMul" for name in n.input if name in tables]
    table = [model.config.n_head, model.config.d_head, ring_capacity(span)]
    assert ops.count("MatMul") == 4 * model.config.n_layer and constants == [table] * model.config.n_layer
    assert json.loads((folders["onnx"] / "export.json").read_text())["weights"] == "float32"
    floats, int8 = ExportedDecoder(folders["onnx"]), ExportedDecoder(tmp_path / "int8")
    ids = np.random.default_rng(0).integers(0, 37, (3, 12))
    want, got = floats.step(floats.read_prompt(ids)), int8.step(int8.read_prompt(ids))
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()
    assert np.array_equal(int8.greedy(ids, 32), floats.greedy(ids, 32))
    with pytest.raises(TxlError, match="--quantize int8 is for --format onnx"):
        export_decoder(model, vocab, tmp_path / "pt2", span, "pt2", quantize="int8")
    with pytest.raises(TxlError, match="--quantize must be one of int8"):
        export_decoder(model, vocab, tmp_path / "int4", span, "onnx", quantize="int4")
    assert not (tmp_path / "pt2").exists() and not (tmp_path / "int4").exists()


def test_bench_export_table_has_the_int8_row():
    from txl_studies.speed.export import export_table

    config = dict(vocab_size=37, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=24, tgt_len=4, mem_len=6)
    table = export_table(config, batches=(2,), gen_tokens=3, repeats=1, log=lambda line: None)
    (row,) = table["decoding"]
    assert row["batch"] == 2 and row["context"] == 6
    assert {"ratio_onnxruntime", "ratio_onnxruntime_int8", "ratio_graphs_eager"} <= row.keys()
    assert row["int8_greedy_agreement"] == 1.0  # the model's weights are seeded: measured, all 6 tokens equal


# --- the runner's arguments and manifest, checked before any work ---------------------------------------------

def _with_manifest(folders, fmt, tmp_path, **changes):
    """A copy of the ``fmt`` export whose export.json has ``changes``."""
    import shutil

    folder = tmp_path / f"{fmt}-changed"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(folders[fmt], folder)
    manifest = json.loads((folder / "export.json").read_text())
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            manifest[outer] = {**manifest[outer], inner: value}
        else:
            manifest[key] = value
    (folder / "export.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
@pytest.mark.parametrize("change,said", [
    ({"capacity": 10**9}, "says capacity 1,000,000,000, but the segment graph's output keys has shape [3, 'batch', 2, 8, 6]"),
    ({"n_layer": 4}, "says n_layer 4, but the segment graph's input mems has shape [3, 'batch', 7, 16]"),
    ({"span.mem_len": 70}, "says span.mem_len 70, but the segment graph's input mems"),
    ({"span.tgt_len": 9}, "says span.tgt_len 9, but the segment graph's input input_ids has shape ['batch', 5]"),
    ({"d_head": 1}, "says d_head 1"),
    ({"vocab_size": 99}, "says vocab_size 99, but the step graph's output logits has shape ['batch', 37]"),
])
def test_a_manifest_that_disagrees_with_its_graphs_is_refused_before_any_array_is_made(exported, tmp_path, monkeypatch,
                                                                                       fmt, change, said):
    _, _, folders = exported
    folder = _with_manifest(folders, fmt, tmp_path, **change)

    def no_arrays(*args, **kwargs):
        raise AssertionError("an array was made from the manifest's sizes")

    monkeypatch.setattr(np, "zeros", no_arrays)
    with pytest.raises(TxlError) as refused:
        ExportedDecoder(folder).greedy(np.array([[1, 2, 3]]), 2)
    message = str(refused.value)
    assert message.startswith(f"{folder / 'export.json'} {said}") and message.endswith(": export the model again")


def test_other_manifest_fields_are_checked_too(exported, tmp_path, capsys):
    from txl_recipes.export.runner import main as runner_main

    _, _, folders = exported
    names = json.loads((folders["onnx"] / "export.json").read_text())["inputs"]
    swapped = {**names, "segment": ["mems", "input_ids", "mem_padding", "n_valid"]}
    with pytest.raises(TxlError, match=r"the segment graph's inputs are \['input_ids', 'mems', 'mem_padding', "
                                       r"'n_valid'\], not those export.json lists"):
        ExportedDecoder(_with_manifest(folders, "onnx", tmp_path, inputs=swapped))
    for key, value in (("dtype", "float16"), ("logits", "probabilities"), ("weights", "int4"), ("dtype", None),
                       ("span.clamp_len", True)):
        with pytest.raises(TxlError, match=f"bad or missing: {key.split('.')[0]}"):
            ExportedDecoder(_with_manifest(folders, "onnx", tmp_path, **{key: value}))
    # from the command line: one line, exit status 2
    assert runner_main([str(_with_manifest(folders, "onnx", tmp_path, capacity=10**9)), "x"]) == 2
    assert "says capacity 1,000,000,000" in one_error_line(capsys.readouterr().err)


def test_the_runners_threads_are_checked_first_and_chosen_as_every_command_chooses_them(exported, tmp_path, capsys,
                                                                                         monkeypatch):
    from txl.data import CharTokenizer
    import txl_recipes.export.runner as runner

    _, _, folders = exported
    made = []

    class Recorded(ExportedDecoder):
        def __init__(self, folder, threads=None):
            made.append(threads)
            super().__init__(folder, threads)

    monkeypatch.setattr(runner, "ExportedDecoder", Recorded)
    for threads in ("99999", "-1"):
        assert runner.main([str(folders["onnx"]), "x", "-n", "1", "--threads", threads]) == 2
        assert one_error_line(capsys.readouterr().err) == (f"txl: error: --threads must be from 0 (automatic: the free "
                                                           f"CPUs) to 1024, got {threads}")
    assert runner.main([str(folders["onnx"]), "x", "-n", "-2"]) == 2
    assert "-n/--max-new-tokens must be >= 0, got -2" in one_error_line(capsys.readouterr().err)
    assert made == []  # nothing was loaded
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    folder = _with_manifest(folders, "onnx", tmp_path)
    CharTokenizer.build("abcdefghij").save(folder / "vocab.json")  # the tiny model's 37 ids hold these 10 characters
    code = runner.main([str(folder), "abc", "-n", "3"])
    out, err = capsys.readouterr()
    assert code == 0 and out.startswith("abc") and made == [1] and "threads 1 (OMP_NUM_THREADS" in err, err
    # the sibling: the class, called from Python, refuses a count no machine has
    for threads in (99999, -1, True, 2.5):
        with pytest.raises(TxlError, match="threads must be from 0"):
            ExportedDecoder(folders["onnx"], threads)
