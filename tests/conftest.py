import os

import pytest
import torch
from hypothesis import settings

# CI runs a fixed set of examples (HYPOTHESIS_PROFILE=ci in .ci/run) so that a result is reproducible;
# local runs draw new examples each time and add a failure found that way as an @example.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from txl.model import TransformerXLConfig, TransformerXLLM


def tiny_config(**overrides) -> TransformerXLConfig:
    values = dict(vocab_size=37, n_layer=3, d_model=16, n_head=2, d_head=6, d_inner=24, dropout=0.0,
                  dropatt=0.0, tgt_len=5, mem_len=7)
    values.update(overrides)
    return TransformerXLConfig(**values)


def tiny_model(seed: int = 0, dtype=torch.float64, **overrides) -> TransformerXLLM:
    torch.manual_seed(seed)
    model = TransformerXLLM(tiny_config(**overrides)).to(dtype)
    model.eval()
    return model


@pytest.fixture(scope="module")
def one_thread():
    """For modules of tiny models: one thread is much faster than several fighting over busy cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_model():
    return tiny_model


@pytest.fixture
def corpus(tmp_path):
    """A small repetitive text file (15 kB, 37 distinct characters) for short training runs."""
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps over {i % 5} dogs.\n"
                            for i in range(300)))
    return path


def run_cli(capsys, *argv):
    """Run ``txl ARGV`` in this process: (exit status, stdout, stderr)."""
    from txl.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    """The single ``txl: error:`` line of ``err`` (asserts there is exactly one and no traceback)."""
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert lines[0].startswith("txl: error: ") and "Traceback" not in err
    return lines[0]


def run_segments(model, ids, lengths, mems=None):
    """Feed the first ``sum(lengths)`` columns of ``ids`` through ``model`` in segments of ``lengths``,
    carrying the memory: (logits [B, sum(lengths), V], the last memory)."""
    logits = []
    start = 0
    for n in lengths:
        out = model(ids[:, start:start + n], mems=mems)
        mems = out.mems
        logits.append(out.logits)
        start += n
    return torch.cat(logits, 1), mems
