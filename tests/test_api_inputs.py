"""Issue 12 item 7: bad inputs to the Python API are one TxlError naming the argument, never another exception.

The space of bad inputs (property-based): token ids given as Python lists or of a non-integer dtype,
empty batches and segments, labels outside ``[0, vocab)`` other than -100 or of a wrong dtype or
shape, memories of the wrong dtype (float64, integer, bool, half precision outside autocast) or
device, or not tensors at all. Each is tried at every public entry point that takes it: the
model's ``forward`` and ``hidden_states``, ``generate`` and the token-stream functions
(``evaluate``, ``evaluate_sliding_window``, ``dynamic_evaluate``, ``score``). Good inputs (any
label in range or -100, the memory a previous call returned, bf16 autocast) still work.
"""

import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tiny_model
from txl.config import IGNORE_INDEX
from txl.errors import TxlError
from txl.evaluation.dynamic import dynamic_evaluate
from txl.evaluation.scoring import score
from txl.evaluation.stream import evaluate, evaluate_sliding_window
from txl.generation import beam_search, generate

V = 37  # tiny_model's vocabulary
MODEL = tiny_model(dtype=torch.float32)
ABS = tiny_model(dtype=torch.float32, attn_type="abs")
SETTINGS = dict(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

pytestmark = pytest.mark.usefixtures("one_thread")


def _ids(seed: int, b: int, t: int) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def _mems(seed: int, b: int) -> list[torch.Tensor]:
    with torch.no_grad():
        return MODEL(_ids(seed, b, 4)).mems


def _raises_naming(call, name: str) -> None:
    """``call()`` raises TxlError whose message names ``name``; any other exception fails the test."""
    with pytest.raises(TxlError) as info:
        call()
    assert name in str(info.value), str(info.value)


# --- the bad inputs -------------------------------------------------------------------------------

bad_labels = st.one_of(st.integers(min_value=-2**62, max_value=-1).filter(lambda v: v != IGNORE_INDEX),
                       st.integers(min_value=V, max_value=2**62))
bad_mem_dtypes = st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                  torch.uint8, torch.bool])
bad_id_dtypes = st.sampled_from([torch.float32, torch.float64, torch.bool, torch.uint8, torch.int16, torch.int8])


@st.composite
def bad_model_call(draw):
    """(kind, argument name, keyword arguments) for forward/hidden_states/generate."""
    seed, b, t = draw(st.integers(0, 2**16)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    ids = _ids(seed, b, t)
    kind = draw(st.sampled_from(["list_ids", "empty_batch", "empty_segment", "id_dtype", "id_range", "label_range",
                                 "label_dtype", "label_list", "label_shape", "mem_dtype", "mem_list", "mem_device",
                                 "mem_not_tensor"]))
    if kind == "list_ids":
        return kind, "input_ids", dict(input_ids=ids.tolist())
    if kind == "empty_batch":
        return kind, "input_ids", dict(input_ids=torch.zeros(0, t, dtype=torch.int64))
    if kind == "empty_segment":
        return kind, "input_ids", dict(input_ids=torch.zeros(b, 0, dtype=torch.int64))
    if kind == "id_dtype":
        return kind, "input_ids", dict(input_ids=ids.to(draw(bad_id_dtypes)))
    if kind == "id_range":
        bad = draw(st.one_of(st.integers(min_value=-2**40, max_value=-1), st.integers(min_value=V, max_value=2**40)))
        ids[draw(st.integers(0, b - 1)), draw(st.integers(0, t - 1))] = bad
        return kind, "input_ids", dict(input_ids=ids)
    if kind.startswith("label"):
        labels = _ids(seed + 1, b, t)
        if kind == "label_range":
            labels[draw(st.integers(0, b - 1)), draw(st.integers(0, t - 1))] = draw(bad_labels)
        elif kind == "label_dtype":
            labels = labels.to(draw(st.sampled_from([torch.float32, torch.float64, torch.bool])))
        elif kind == "label_list":
            labels = labels.tolist()
        else:
            labels = _ids(seed + 1, b, t + draw(st.integers(1, 3)))
        return kind, "labels", dict(input_ids=ids, labels=labels)
    mems = _mems(seed, b)
    if kind == "mem_dtype":
        dtype = draw(bad_mem_dtypes)
        mems = [m.to(dtype) for m in mems] if draw(st.booleans()) else [*mems[:-1], mems[-1].to(dtype)]
    elif kind == "mem_list":
        mems = [m.tolist() for m in mems]
    elif kind == "mem_device":
        mems = [m.to("meta") for m in mems]
    else:
        mems = draw(st.sampled_from([torch.stack(mems), "mems", 3.0, [None] * len(mems)]))
    return kind, "mems", dict(input_ids=ids, mems=mems)


@settings(**SETTINGS)
@given(call=bad_model_call(), entry=st.sampled_from(["forward", "hidden_states", "generate"]))
def test_bad_model_inputs_raise_txl_error_naming_the_argument(call, entry):
    kind, name, kwargs = call
    if "labels" in kwargs and entry != "forward":
        entry = "forward"  # only forward takes labels
    if entry == "forward":
        _raises_naming(lambda: MODEL(**kwargs), name)
    elif entry == "hidden_states":
        _raises_naming(lambda: MODEL.hidden_states(**kwargs), name)
    else:
        _raises_naming(lambda: generate(MODEL, kwargs["input_ids"], 2, mems=kwargs.get("mems")), name)


@settings(**SETTINGS)
@given(call=bad_model_call())
def test_bad_model_inputs_under_autocast(call):
    """The same under bf16 autocast; memory in bf16 is allowed there, so only other dtypes are bad."""
    kind, name, kwargs = call
    mems = kwargs.get("mems")
    if kind == "mem_dtype" and any(isinstance(m, torch.Tensor) and m.dtype == torch.bfloat16 for m in mems) \
            and all(m.dtype in (torch.bfloat16, torch.float32) for m in mems):
        return  # the autocast dtype: a good memory here
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _raises_naming(lambda: MODEL(**kwargs), name)


@st.composite
def bad_tokens(draw):
    """A token stream that is not 1-D integer ids in the vocabulary."""
    seed, n = draw(st.integers(0, 2**16)), draw(st.integers(20, 40))
    ids = np.random.default_rng(seed).integers(0, V, n)
    kind = draw(st.sampled_from(["range", "float", "2d", "ragged", "tensor_float"]))
    if kind == "range":
        ids[draw(st.integers(0, n - 1))] = draw(st.one_of(st.integers(-2**40, -1), st.integers(V, 2**40)))
        return ids.tolist() if draw(st.booleans()) else ids
    if kind == "float":
        return ids.astype(draw(st.sampled_from([np.float32, np.float64])))
    if kind == "2d":
        return ids[: n // 2 * 2].reshape(2, -1)
    if kind == "ragged":
        return [ids[:3].tolist(), ids[:5].tolist()]
    return torch.from_numpy(ids).float()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=bad_tokens(), entry=st.sampled_from(["evaluate", "sliding", "dynamic"]))
def test_bad_token_streams_raise_txl_error_naming_tokens(tokens, entry):
    calls = {"evaluate": lambda: evaluate(MODEL, tokens, batch_size=2),
             "sliding": lambda: evaluate_sliding_window(MODEL, tokens, context=4, stride=4),
             "dynamic": lambda: dynamic_evaluate(MODEL, tokens, lr=0.0)}
    _raises_naming(calls[entry], "tokens")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), bad=st.one_of(st.integers(-2**40, -1), st.integers(V, 2**40)))
def test_score_refuses_ids_outside_the_vocabulary(seed, bad):
    doc = np.random.default_rng(seed).integers(0, V, 10)
    doc[seed % 10] = bad
    _raises_naming(lambda: score(MODEL, [doc]), "document 0")


def test_abs_model_refuses_memory_everywhere():
    mems = _mems(0, 1)
    _raises_naming(lambda: ABS(_ids(0, 1, 3), mems=mems), "mem")
    _raises_naming(lambda: generate(ABS, _ids(0, 1, 3), 2, mems=mems), "mem")


# --- good inputs still work -----------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), b=st.integers(1, 3), t=st.integers(1, 6), ignore=st.floats(0, 1),
       id_dtype=st.sampled_from([torch.int64, torch.int32]))
def test_good_inputs_work(seed, b, t, ignore, id_dtype):
    ids = _ids(seed, b, t).to(id_dtype)
    labels = _ids(seed + 1, b, t).to(id_dtype)
    mask = torch.rand(b, t, generator=torch.Generator().manual_seed(seed)) < ignore
    labels[mask] = IGNORE_INDEX  # -100 anywhere, including everywhere
    with torch.no_grad():
        out = MODEL(ids, labels=labels)
        assert torch.isfinite(out.loss) and out.token_loss.shape == (b, t)
        assert bool((out.token_loss[mask] == 0).all())
        out2 = MODEL(ids, mems=out.mems, labels=labels)  # the memory a call returned is accepted
        h, mems = MODEL.hidden_states(ids, mems=tuple(out2.mems))
        assert h.shape == (b, t, MODEL.config.d_model) and len(mems) == MODEL.config.n_layer
    assert generate(MODEL, ids.long(), 2, mems=mems).shape == (b, t + 2)


@pytest.mark.parametrize("overrides", [{}, {"d_embed": 8}, {"cutoffs": [10], "div_val": 2, "d_embed": 16}])
def test_autocast_memory_is_accepted_from_segment_to_segment(overrides):
    """bf16 autocast evaluation passes memory partly in bf16 between segments: still accepted, in and out."""
    model = tiny_model(dtype=torch.float32, **overrides)
    ids = _ids(0, 2, 5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mems = model(ids).mems
        mems = model(ids, mems=mems, labels=ids).mems
        mems = model(ids, mems=[m.bfloat16() for m in mems]).mems  # all in the autocast dtype
    assert all(m.dtype in (torch.float32, torch.bfloat16) for m in mems)
    tokens = np.random.default_rng(0).integers(0, V, 60)
    assert np.isfinite(evaluate(model, tokens, batch_size=2, dtype="bfloat16").loss)


def test_float64_model_takes_float64_memory_and_refuses_float32():
    model = tiny_model(dtype=torch.float64)
    ids = _ids(0, 1, 4)
    mems = model(ids).mems
    assert mems[0].dtype == torch.float64
    model(ids, mems=mems)
    _raises_naming(lambda: model(ids, mems=[m.float() for m in mems]), "mems[0]")


def test_sizes_beyond_the_text_or_the_machine_are_handled_in_one_line(monkeypatch):
    """Sizes found by a red team that crashed deep inside torch: a clamp_len beyond any distance is no
    clamping; more evaluation streams than targets give the result of one stream per target (the rest
    would be padding); numpy integers are integers; a segment whose attention scores cannot fit is
    refused with one line naming tgt_len; beams beyond the distinct continuations are refused; a torch
    dtype names an autocast dtype."""
    model = tiny_model(tgt_len=4, mem_len=6)
    ids = np.random.default_rng(0).integers(0, V, 120)
    plain = evaluate(model, ids, unit="ppl").loss
    assert evaluate(model, ids, clamp_len=10**30, unit="ppl").loss == plain
    assert evaluate(model, ids, clamp_len=2**64, unit="ppl").loss == plain
    assert evaluate(model, ids, batch_size=10**30, unit="ppl").loss == evaluate(model, ids, batch_size=119,
                                                                                unit="ppl").loss
    assert evaluate(model, ids, mem_len=np.int64(6), unit="ppl").loss == plain
    assert evaluate(model, ids, dtype=torch.float32, unit="ppl").loss == plain
    for bad in (1.5, None, True):
        with pytest.raises(TxlError, match="batch_size must be an integer"):
            evaluate(model, ids, batch_size=bad)
    with pytest.raises(TxlError, match="num_beams 100 is more than the 37 distinct continuations of 1 token"):
        beam_search(model, _ids(0, 1, 3), 100, 1)
    with pytest.raises(TxlError, match="num_beams must be an integer"):
        beam_search(model, _ids(0, 1, 3), 2.0, 2)
    assert len(beam_search(model, _ids(0, 1, 3), 40, 2).tokens) == 2  # 37**2 continuations
    assert len(beam_search(model, _ids(0, 1, 3), 40, 0).tokens) == 0  # one continuation: the empty one
    with pytest.raises(TxlError, match="max_new_tokens must be >= 0"):
        beam_search(model, _ids(0, 1, 3), 40, -1)
    from txl import runtime
    from txl.kernels.cpu import check_reading_fits
    from txl.segments import segments
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda *device: 2**28)
    with pytest.raises(TxlError, match=r"a segment of 8,000 tokens over 8,000 keys .* use a smaller tgt_len"):
        evaluate(model, np.random.default_rng(0).integers(0, V, 8001), tgt_len=8000, batch_size=1)
    span = model.config.span.replace(tgt_len=3000)
    check_reading_fits(model, _ids(0, 1, 1000), span)  # read without autograd, in blocks: fits
    with pytest.raises(TxlError, match=r"a segment of 3,000 tokens over 3,000 keys \(batch 2\)"):
        check_reading_fits(model, _ids(0, 2, 3000), span, grad=True)  # a bias kept per layer: refused sooner
    # a memory far beyond the text costs what the text holds: 100 billion positions of mem_len on 40 tokens read
    far = span.replace(tgt_len=4, mem_len=10**11)
    check_reading_fits(model, _ids(0, 1, 40), far)
    assert len(list(segments(model, _ids(0, 1, 40), span=far))) == 10
    # the segment loop itself never asks how much memory is free: its callers do
    from txl.kernels import cpu
    monkeypatch.setattr(cpu, "attention_bytes", lambda *args: 2**40)  # every reading too large
    small = span.replace(tgt_len=10)
    with pytest.raises(TxlError, match="a segment of 10 tokens"):
        check_reading_fits(model, _ids(0, 1, 100), small)
    with torch.no_grad():
        assert len(list(segments(model, _ids(0, 1, 100), span=small))) == 10


def test_memory_figures_follow_process_limits_and_allocation_failures_are_one_line(capsys, monkeypatch):
    """available_memory_bytes counts an address-space limit (ulimit -v); an allocation that no check
    foresaw ends a command with one line and exit 1, not a traceback."""
    import subprocess
    import sys

    from conftest import one_error_line, run_cli
    from txl.cli import eval as eval_cli
    from txl.runtime import available_memory_bytes, out_of_memory

    code = ("import resource, os; from txl.runtime import available_memory_bytes as a; "
            "vsz = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE'); "
            "resource.setrlimit(resource.RLIMIT_AS, (vsz + 2**30, resource.RLIM_INFINITY)); print(a())")
    limited = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 < limited <= 2**30 < available_memory_bytes()
    assert out_of_memory(RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"))
    assert out_of_memory(MemoryError()) and not out_of_memory(RuntimeError("shape mismatch"))

    def allocate(args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 81920008192 bytes")

    monkeypatch.setattr(eval_cli, "run", allocate)
    code, _, err = run_cli(capsys, "eval", "nowhere")
    assert code == 1 and one_error_line(err).startswith("txl: error: out of memory:")


@pytest.mark.parametrize("call, message", [
    (lambda x: generate(MODEL, x, 2.5), "max_new_tokens must be an integer >= 0, got 2.5"),
    (lambda x: generate(MODEL, x, None), "max_new_tokens must be an integer >= 0, got None"),
    (lambda x: generate(MODEL, x, 2, top_k=1.5), "top_k must be an integer >= 1, got 1.5"),
    (lambda x: generate(MODEL, x, 2, top_k=True), "top_k must be an integer >= 1, got True"),
    (lambda x: generate(MODEL, x, 3, no_repeat_ngram_size=1.5), "no_repeat_ngram_size must be an integer >= 0"),
    (lambda x: generate(MODEL, x, 2, temperature="0.5"), "temperature must be a finite number >= 0, got '0.5'"),
    (lambda x: generate(MODEL, x, 2, generator=5), "generator must be a torch.Generator or a list of them"),
    (lambda x: generate(MODEL, x, 2, generator=[torch.Generator(), 5]), "generator must be a torch.Generator"),
    (lambda x: score(MODEL, ["abc", [1, 2, 3]], tokenizer=object()), "document 1 is a list among texts"),
])
def test_decoding_and_scoring_arguments_of_the_wrong_type_raise_txl_error(call, message):
    with pytest.raises(TxlError, match=re.escape(message)):
        call(torch.randint(0, V, (1, 4)))


def test_save_pretrained_refuses_a_file_and_a_checkpoint_with_checksums(tmp_path):
    from txl.data import ByteTokenizer
    from txl.config import RunConfig
    from txl.training.checkpoint import save_checkpoint

    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(TxlError, match="is a file; save_pretrained writes a folder"):
        MODEL.save_pretrained(tmp_path / "notes.txt")
    model = tiny_model(dtype=torch.float32, vocab_size=256)
    save_checkpoint(tmp_path / "ckpt", model, ByteTokenizer(), RunConfig(model=model.config), {"step": 1})
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    with pytest.raises(TxlError, match="is a txl checkpoint or run folder"):
        model.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before
    model.save_pretrained(tmp_path / "plain")
    model.save_pretrained(tmp_path / "plain")  # its own earlier output is replaced, as usual


def test_numbers_as_numpy_or_tensor_scalars_are_accepted():
    x = torch.randint(0, V, (1, 4))
    ref = generate(MODEL, x, 3, temperature=0)
    same = generate(MODEL, x, torch.tensor(3), temperature=torch.tensor(0.0), top_k=np.int64(5),
                    top_p=torch.tensor(0.9), repetition_penalty=np.float32(1.0), min_new_tokens=torch.tensor(0))
    assert torch.equal(ref, same)


def test_continue_texts_and_score_texts_check_their_arguments():
    from txl.data import ByteTokenizer
    from txl.evaluation.scoring import score_texts
    from txl.generation import continue_texts

    model = tiny_model(dtype=torch.float32, vocab_size=256)
    with pytest.raises(TxlError, match="end_ids must be a sequence of integer token ids"):
        continue_texts(model, ByteTokenizer(), [torch.tensor([1, 2])], max_new_tokens=2, end_ids=[1.5])
    with pytest.raises(TxlError, match="one per prompt"):
        continue_texts(model, ByteTokenizer(), [torch.tensor([1, 2])], max_new_tokens=2, generator=5)
    scores = score_texts(model, ByteTokenizer(), (t for t in ["abc", "defg"]))  # an iterator of texts
    assert [s.n_scored for s in scores] == [2, 3]


def test_save_pretrained_refuses_a_run_folder(tmp_path):
    (tmp_path / "run" / "best").mkdir(parents=True)
    with pytest.raises(TxlError, match="is a txl checkpoint or run folder"):
        MODEL.save_pretrained(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["best"]


def test_a_cuda_index_beyond_the_machine_is_refused_with_its_count(monkeypatch):
    from txl.runtime import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(TxlError, match=r"has 2 CUDA device\(s\); use cuda:0 to cuda:1$"):
        resolve_device("cuda:2")
    assert resolve_device("cuda:1") == torch.device("cuda:1")


def test_loading_names_a_wrong_path_type_and_a_run_folder(tmp_path):
    from txl import TransformerXLLM, load_checkpoint

    with pytest.raises(TxlError, match=r"^load_checkpoint takes a folder path \(str or pathlib.Path\), got int$"):
        load_checkpoint(5)
    (tmp_path / "run.json").write_text("{}")  # a training run's folder: its checkpoints are inside it
    with pytest.raises(TxlError, match=rf"^{re.escape(str(tmp_path))} is a run folder, not a checkpoint: give "
                                       rf"{re.escape(str(tmp_path / 'best'))} \(or last\), or load it with "
                                       r"txl.load_checkpoint\("):
        TransformerXLLM.from_pretrained(tmp_path)
