import pytest
import torch

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
