"""No host synchronisation inside the per-token and per-segment loops.

On an accelerator, reading a tensor's value on the host (``.item()``, ``.tolist()``, ``bool(t)``,
``.nonzero()``...) waits for all the work queued before it, so a read per token or per segment
serialises the device and the host. txl asks one predicate, :func:`txl.runtime.reads_values`, before
every value check; here it answers as it does on an accelerator (False), and a torch function mode
counts every value read during a generation or an evaluation. A loop that reads per step makes the
count grow with the number of steps: it must not.
"""

import sys

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import tiny_model
from txl import runtime
from txl.errors import TxlError
from txl.evaluation.stream import evaluate
from txl.generation import DecodingRules, generate
from txl.segments import segments
from txl.config import AttentionSpan

# tensor methods and functions whose result is a host value (or a shape that depends on values)
READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "is_nonzero", "cpu",
         "numpy", "__array__", "__format__", "__repr__", "nonzero", "masked_select", "unique", "equal", "allclose",
         "argwhere", "_local_scalar_dense"}


class HostReads(TorchFunctionMode):
    """Counts the calls that read a tensor's values on the host (names in :data:`READS`) and, as
    ``"upload"``, the host-to-device copies a loop could make: ``torch.tensor``/``torch.as_tensor`` given a
    ``device`` and ``.to(device)`` (on an accelerator such a copy from pageable memory waits for the
    device too). On CPU both kinds are free, so the counts stand for what would happen on a GPU."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in READS:
            self.calls.append(name)
        elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            self.calls.append("upload")
        elif name == "to" and (kwargs.get("device") is not None
                               or any(isinstance(a, (torch.device, str)) for a in args[1:])):
            self.calls.append("upload")
        return func(*args, **kwargs)


@pytest.fixture
def accelerator_checks(monkeypatch):
    """Every module that imported :func:`txl.runtime.reads_values` sees it answer False, as on an accelerator."""
    original = runtime.reads_values
    patched = [name for name, module in list(sys.modules.items())
               if name.startswith("txl") and getattr(module, "reads_values", None) is original]
    for name in patched:
        monkeypatch.setattr(sys.modules[name], "reads_values", lambda t: False)
    assert {"txl.runtime", "txl.model.checks", "txl.generation.sampling"} <= set(patched)


def _reads(fn) -> list[str]:
    with HostReads() as mode:
        fn()
    return mode.calls


def test_the_counter_sees_each_kind_of_read():
    t = torch.arange(4.0)
    calls = _reads(lambda: (t.tolist(), t[0].item(), bool(t.sum() > 0), int(t[1]), t.nonzero(), t.cpu(), t.to("cpu"),
                            torch.tensor([1, 2], device="cpu"), t.to(torch.float64)))
    assert calls == ["tolist", "item", "__bool__", "__int__", "nonzero", "cpu", "upload", "upload"]


@pytest.mark.parametrize("overrides", [dict(), dict(cutoffs=[10, 20], div_val=2, d_embed=16),
                                       dict(attn_type="shaw", shaw_max_dist=6), dict(attn_type="abs")],
                         ids=["rel", "adaptive", "shaw", "abs"])
@pytest.mark.parametrize("rules", [dict(temperature=0), dict(temperature=0.8, top_k=5, top_p=0.9),
                                   dict(temperature=0, min_new_tokens=3)],
                         ids=["greedy", "sampled", "min_new_tokens"])
def test_generation_reads_nothing_per_token(accelerator_checks, overrides, rules):
    model = tiny_model(dtype=torch.float32, **overrides)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(0))
    kwargs = dict(rules=DecodingRules(**rules), end_ids=[1] if "min_new_tokens" in rules else ())
    short = _reads(lambda: generate(model, ids, 3, generator=torch.Generator().manual_seed(1), **kwargs))
    long = _reads(lambda: generate(model, ids, 24, generator=torch.Generator().manual_seed(1), **kwargs))
    assert long == short, f"reads grow with the tokens: {len(short)} for 3 tokens, {len(long)} for 24: {long}"
    assert short.count("__int__") <= 1  # at most the faults' one check, before the last step


@pytest.mark.parametrize("int8", [False, True], ids=["float32", "int8"])
def test_compiled_generation_reads_nothing_per_token(accelerator_checks, int8):
    # the ring decoder's counters live on the host; what the step reads of them is made on the device
    from txl.kernels.int8 import quantize_int8

    model = tiny_model(dtype=torch.float32)
    model = quantize_int8(model) if int8 else model
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(0))
    short = _reads(lambda: generate(model, ids, 3, temperature=0, compile="aot_eager"))
    long = _reads(lambda: generate(model, ids, 24, temperature=0, compile="aot_eager"))  # fills, then rotates
    assert long == short, f"reads grow with the tokens: {len(short)} for 3 tokens, {len(long)} for 24: {long}"


def test_rules_that_need_the_history_read_one_step_at_a_time(accelerator_checks):
    # the repetition penalty looks at the generated tokens on the host: one read per step, no more
    model = tiny_model(dtype=torch.float32)
    ids = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(0))
    rules = DecodingRules(temperature=0, repetition_penalty=1.3)
    reads = [_reads(lambda n=n: generate(model, ids, n, rules=rules)).count("tolist") for n in (3, 24)]
    assert reads == [3, 24]


def test_evaluation_reads_nothing_per_segment(accelerator_checks):
    model = tiny_model(dtype=torch.float32)
    tokens = np.random.default_rng(0).integers(0, 37, 400)
    few = _reads(lambda: evaluate(model, tokens[:60], batch_size=2, tgt_len=5, mem_len=7))
    many = _reads(lambda: evaluate(model, tokens, batch_size=2, tgt_len=5, mem_len=7))
    assert many == few, f"reads grow with the segments: {few} for 6 segments, {many} for 40"


def test_rows_of_different_lengths_leave_without_a_read(accelerator_checks):
    model = tiny_model(dtype=torch.float32)
    inputs = torch.randint(0, 37, (3, 40), generator=torch.Generator().manual_seed(2))
    span = AttentionSpan(tgt_len=5, mem_len=7)

    def read(width):
        with torch.no_grad():
            return [seg.rows.numel() for seg in segments(model, inputs[:, :width], inputs[:, :width], span=span,
                                                         lengths=[width, width // 2, 3])]
    # the lengths are read once, before the loop (here from a list: a CPU tensor made and read back); one
    # upload each time rows leave (twice in both widths: at 5 and at 10 or 20 tokens)
    assert _reads(lambda: read(20)) == _reads(lambda: read(40)) == ["cpu", "tolist", "upload", "upload"]
    assert read(40) == [3, 2, 2, 2, 1, 1, 1, 1]  # rows leave at the first segment starting at or past their length


def _nan_model():
    model = tiny_model(dtype=torch.float32)
    with torch.no_grad():
        model.crit.out_layers[0].bias.fill_(float("nan"))
    return model


def test_faults_found_on_the_device_raise_before_the_last_step(accelerator_checks):
    from txl.generation import generate_steps

    model = _nan_model()
    ids = torch.randint(0, 37, (2, 4), generator=torch.Generator().manual_seed(0))
    for rules in (DecodingRules(temperature=0), DecodingRules(temperature=1.0, top_p=0.9)):
        with pytest.raises(TxlError, match="non-finite scores"):
            generate(model, ids, 5, rules=rules)
        # a consumer that asks for exactly the steps it wants (as txl serve does) still gets the error
        steps = generate_steps(model, ids, 3, rules=rules)
        first = [next(steps), next(steps)]  # on the device, not raised at once: noted
        assert all(step.faults is not None for step in first)
        with pytest.raises(TxlError, match="non-finite scores"):
            next(steps)
        # and one that may stop early checks the steps it reads
        with pytest.raises(TxlError, match="non-finite scores"):
            first[0].check()


def test_a_row_left_without_a_token_is_said_as_such_on_the_device(accelerator_checks):
    # no_repeat_ngram_size 1 bans every token generated: after 37 tokens of a 37-token vocabulary, none is left
    model = tiny_model(dtype=torch.float32)
    ids = torch.randint(0, 37, (1, 4), generator=torch.Generator().manual_seed(0))
    with pytest.raises(TxlError, match="the decoding rules left no token to choose"):
        generate(model, ids, 40, rules=DecodingRules(temperature=0, no_repeat_ngram_size=1))


def test_completions_that_stop_early_check_what_they_read(accelerator_checks):
    from txl.data import ByteTokenizer
    from txl.generation import continue_texts

    model = tiny_model(dtype=torch.float32, vocab_size=256)
    with torch.no_grad():
        model.crit.out_layers[0].bias.fill_(float("nan"))
    prompt = torch.tensor(list(b"abc"))
    with pytest.raises(TxlError, match="non-finite scores"):  # the NaN argmax is token 0: an end id at once
        continue_texts(model, ByteTokenizer(), [prompt], max_new_tokens=20, end_ids=(0,),
                       rules=DecodingRules(temperature=0))
