"""Config validation and safe save/load."""

import json

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError
from txl.model import TransformerXLConfig, TransformerXLLM


@pytest.mark.parametrize("bad,match", [
    ({"n_layer": 0}, "n_layer"), ({"d_model": 15}, "even"), ({"dropout": 1.0}, "dropout"),
    ({"attn_type": "foo"}, "attn_type"), ({"mem_len": -1}, "mem_len"), ({"n_head": True}, "integer"),
    ({"d_head": 2.5}, "integer")])
def test_config_rejects_impossible_values(bad, match):
    with pytest.raises(TxlError, match=match):
        TransformerXLConfig(**bad)


def test_config_rejects_unknown_keys():
    with pytest.raises(TxlError, match="unknown key.*n_layers"):
        TransformerXLConfig.from_dict({"n_layers": 3})


def test_save_load_round_trip(tmp_path):
    model = tiny_model(dtype=torch.float32, untie_r=True, tie_weight=False)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = TransformerXLLM.from_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    ids = torch.randint(0, 37, (2, 5))
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_load_refuses_mismatched_weights(tmp_path):
    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["d_inner"] = 30
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TxlError, match="do not match"):
        TransformerXLLM.from_pretrained(tmp_path)


def test_load_errors(tmp_path):
    with pytest.raises(TxlError, match="does not exist"):
        TransformerXLLM.from_pretrained(tmp_path / "nope")
    with pytest.raises(TxlError, match="no config.json"):
        TransformerXLLM.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TxlError, match="not valid JSON"):
        TransformerXLLM.from_pretrained(tmp_path)
    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(TxlError, match="cannot read weights"):
        TransformerXLLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("key,value,said", [("foo", 1, "unknown key(s) foo in model"),
                                            ("n_layer", "2", "model.n_layer must be an integer")])
def test_a_bad_config_json_is_named_in_the_error(tmp_path, key, value, said):
    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TxlError) as err:
        TransformerXLLM.from_pretrained(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: {said}"), err.value


@pytest.mark.parametrize("key,value", [("vocab_size", 100_000_000_000), ("n_layer", 100_000_000),
                                       ("d_inner", 10**12)])
def test_sizes_that_cannot_be_allocated_are_refused_before_building(tmp_path, key, value):
    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[key] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(TxlError, match="more than this machine's memory"):
        TransformerXLLM.from_pretrained(tmp_path)
    with pytest.raises(TxlError, match="more than this machine's memory"):
        TransformerXLLM(TransformerXLConfig.from_dict(cfg))


def test_config_is_checked_against_the_weights_header_before_allocating(tmp_path, monkeypatch):
    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["n_layer"] = 4  # the weights hold 3 layers
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    built = []
    real_init = TransformerXLLM.__init__

    def spy(self, config):
        built.append(torch.get_default_device().type)
        real_init(self, config)

    monkeypatch.setattr(TransformerXLLM, "__init__", spy)
    with pytest.raises(TxlError, match=r"missing \['layers\.3\."):
        TransformerXLLM.from_pretrained(tmp_path)
    assert built == ["meta"]  # only the allocation-free model was built


def test_parameter_count_bounds_the_real_count():
    for overrides in ({}, {"cutoffs": [10, 20], "div_val": 2}, {"attn_type": "shaw", "shaw_max_dist": 4},
                      {"untie_r": True, "tie_weight": False, "d_embed": 12}, {"attn_type": "abs"}):
        model = tiny_model(**overrides)
        real = sum(p.numel() for p in model.parameters())
        assert real <= model.config.parameter_count() <= 2 * real


def test_negative_clamp_len_is_refused():
    with pytest.raises(TxlError, match="clamp_len must be >= 0"):
        TransformerXLConfig(clamp_len=-1)


@pytest.mark.parametrize("broken", ["nan", "inf", "int", "bool"])
def test_weights_that_are_not_finite_floats_are_refused(tmp_path, broken):
    from safetensors.torch import load_file, save_file

    tiny_model(dtype=torch.float32).save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    key = "layers.1.ff.net.0.weight"
    value = tensors[key]
    tensors[key] = {"nan": torch.full_like(value, float("nan")), "inf": value.masked_fill(value > 0, float("inf")),
                    "int": value.round().to(torch.int32), "bool": value > 0}[broken]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(TxlError, match=rf"{key} (holds NaN|has dtype)"):
        TransformerXLLM.from_pretrained(tmp_path)
