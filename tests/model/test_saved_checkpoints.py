"""Checkpoints written by an earlier txl load and give the outputs they gave when written.

``tests/fixtures/checkpoints/`` holds one small checkpoint of each kind txl saves (every position
scheme, an adaptive softmax with per-layer u/v as converted checkpoints have, compressive memory, int8
weights, a classifier) and what the model it was saved from computed (``tests/fixtures/make_checkpoints.py``
says how). A change to the model's code, its parameter names or its decoding cache must keep these:
the logits of two segments with the memory carried, the memory left, six greedy tokens, and a
classifier's probabilities.
"""

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from txl.classification import TransformerXLForSequenceClassification
from txl.model import TransformerXLLM

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_checkpoints import DOCUMENTS, KINDS, lm_outputs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
LM_KINDS = [k for k in KINDS if k != "classifier"]


def expected(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / "checkpoints" / name / "expected.safetensors"))


@pytest.mark.parametrize("name", LM_KINDS)
def test_saved_language_model_gives_its_outputs(name):
    model = TransformerXLLM.from_pretrained(FIXTURES / "checkpoints" / name).eval()
    want = expected(name)
    if name == "int8":
        assert model.layers[0].ff.net[0].weight.dtype == torch.int8  # loaded as int8, not dequantised
    else:
        model = model.double()
    got = lm_outputs(model, sum(k.startswith("logits.") for k in want))
    assert sorted(got) == sorted(want)
    tol = 1e-4 if name == "int8" else 1e-10  # float32 int8 products; float64 from the float32 weights
    for key, value in want.items():
        if key == "generated":
            assert torch.equal(got[key], value), key
        else:
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            torch.testing.assert_close(got[key], value, atol=tol, rtol=tol, msg=key)


def test_saved_classifier_gives_its_probabilities():
    model = TransformerXLForSequenceClassification.from_pretrained(FIXTURES / "checkpoints" / "classifier").double()
    assert model.classifier.pooling == "attention" and model.classifier.head_init == "probe"
    got = model.predict_proba([torch.tensor(d) for d in DOCUMENTS]).double()
    torch.testing.assert_close(got, expected("classifier")["proba"], atol=1e-6, rtol=0)  # float32 softmax output
