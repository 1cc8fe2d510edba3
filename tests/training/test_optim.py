"""The parameter-group rule (txl.training.optim) and the initialisation (txl.model.parameters)."""

from __future__ import annotations

import pytest
import torch

from txl.classification.model import TransformerXLForSequenceClassification
from txl.model import TransformerXLConfig, TransformerXLLM
from txl.model.parameters import init_weights, parameter_kinds
from txl.training.optim import make_optimizer, parameter_groups
from txl.training.resume import load_trainer_state, save_trainer_state

SMALL = dict(vocab_size=60, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32)
ADAPTIVE = dict(d_embed=32, cutoffs=[20, 40], div_val=2, tie_weight=True, tie_projs=[False, True, False])


def _groups(model, weight_decay=0.1):
    decay, no_decay = parameter_groups(model, weight_decay)
    assert decay["weight_decay"] == weight_decay and no_decay["weight_decay"] == 0.0
    return set(decay["param_names"]), set(no_decay["param_names"]), decay, no_decay


def _layer_names(layer: int, attn: str, untie_r: bool) -> tuple[set[str], set[str]]:
    """(decay, no_decay) names of one decoder layer of the classifier's body."""
    p = f"body.layers.{layer}."
    decay = {p + "attn.qkv_net.weight", p + "attn.o_net.weight", p + "ff.net.0.weight", p + "ff.net.3.weight"}
    no_decay = {p + "attn.layer_norm.weight", p + "attn.layer_norm.bias", p + "ff.net.0.bias", p + "ff.net.3.bias",
                p + "ff.layer_norm.weight", p + "ff.layer_norm.bias"}
    if attn == "rel":
        decay.add(p + "attn.pos.r_net.weight")
        if untie_r:
            no_decay |= {p + "attn.pos.r_w_bias", p + "attn.pos.r_r_bias"}
    if attn == "shaw":
        no_decay.add(p + "attn.pos.r_emb")
    return decay, no_decay


@pytest.mark.parametrize("attn,untie_r", [("rel", False), ("rel", True), ("shaw", False), ("rope", False)])
def test_groups_of_a_classifier_with_every_option(attn, untie_r):
    config = TransformerXLConfig(**SMALL, **ADAPTIVE, attn_type=attn, untie_r=untie_r,
                                 shaw_max_dist=5 if attn == "shaw" else 0)
    model = TransformerXLForSequenceClassification(config, num_labels=3)
    decay, no_decay, d, nd = _groups(model)
    want_decay = {"head.weight", "body.word_emb.emb_projs.0", "body.word_emb.emb_projs.1",
                  "body.word_emb.emb_projs.2", "body.crit.out_projs.0", "body.crit.out_projs.2"}
    want_no = {"head.bias", "body.word_emb.emb_layers.0.weight", "body.word_emb.emb_layers.1.weight",
               "body.word_emb.emb_layers.2.weight", "body.crit.out_layers.0.bias", "body.crit.out_layers.1.bias",
               "body.crit.out_layers.2.bias", "body.crit.cluster_weight", "body.crit.cluster_bias"}
    if attn == "rel" and not untie_r:
        want_no |= {"body.r_w_bias", "body.r_r_bias"}
    for layer in range(2):
        ld, ln = _layer_names(layer, attn, untie_r)
        want_decay, want_no = want_decay | ld, want_no | ln
    assert decay == want_decay
    assert no_decay == want_no
    # every parameter exactly once: tied ones (out_layers.*.weight, out_projs.1) under their first name
    names = d["param_names"] + nd["param_names"]
    assert len(names) == len(set(names))
    params = d["params"] + nd["params"]
    assert len({id(p) for p in params}) == len(params) == len(list(model.parameters()))
    # the order of named_parameters, but for each layer's own position parameters, drawn before its
    # projections (where they were when they sat on the attention itself: a seed gives the same weights)
    kinds = [n for n, _, _ in parameter_kinds(model)]
    assert sorted(kinds) == sorted(n for n, _ in model.named_parameters())
    own = [n for n in kinds if n.endswith(("attn.pos.r_w_bias", "attn.pos.r_r_bias", "attn.pos.r_emb"))]
    assert len(own) == {("rel", True): 4, ("shaw", False): 2}.get((attn, untie_r), 0)
    for name in own:
        assert kinds.index(name) < kinds.index(name.split("attn.pos.")[0] + "attn.qkv_net.weight")
    assert [n for n in kinds if n not in own] == [n for n, _ in model.named_parameters() if n not in own]


def test_untied_output_tables_are_not_decayed_either():
    model = TransformerXLLM(TransformerXLConfig(**SMALL, d_embed=24, cutoffs=[20], tie_weight=False,
                                                tie_projs=[False, False]))
    decay, no_decay, _, _ = _groups(model)
    assert {"crit.out_layers.0.weight", "crit.cluster_weight", "word_emb.emb_layers.0.weight"} <= no_decay
    assert {"crit.out_projs.0", "crit.out_projs.1", "word_emb.emb_projs.0"} <= decay


def test_lm_and_classifier_trainers_share_the_rule():
    config = TransformerXLConfig(**SMALL)
    lm = TransformerXLLM(config)
    cls = TransformerXLForSequenceClassification(config, num_labels=2)
    lm_decay, lm_no, _, _ = _groups(lm)
    cls_decay, cls_no, _, _ = _groups(cls)
    assert {"body." + n for n in lm_decay} | {"head.weight"} == cls_decay
    assert {"body." + n for n in lm_no} | {"head.bias"} == cls_no
    assert "r_w_bias" in lm_no and "r_r_bias" in lm_no  # the old LM rule decayed u/v


def test_zero_weight_decay_equals_plain_adamw():
    torch.manual_seed(0)
    a = TransformerXLLM(TransformerXLConfig(**SMALL, dropout=0.0))
    b = TransformerXLLM(TransformerXLConfig(**SMALL, dropout=0.0))
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = make_optimizer(a, 1e-2, 0.0), torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.0)
    x = torch.randint(0, 60, (2, 8))
    for model, opt in ((a, opt_a), (b, opt_b)):
        for _ in range(3):
            opt.zero_grad()
            model(x, labels=x).loss.backward()
            opt.step()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n


def _old_layout_order(model) -> list[tuple[str, torch.nn.Parameter]]:
    """named_parameters as the layout that wrote unnamed trainer states listed them: a layer's own position
    parameters (then on the attention itself) before its projections."""
    named = list(model.named_parameters())
    own = [(n, p) for n, p in named if n.endswith(("attn.pos.r_w_bias", "attn.pos.r_r_bias", "attn.pos.r_emb"))]
    order = [x for x in named if x not in own]
    for name, p in own:
        at = [n for n, _ in order].index(name.split("attn.pos.")[0] + "attn.qkv_net.weight")
        order.insert(at, (name, p))
    return order


@pytest.mark.parametrize("overrides", [{}, {"untie_r": True}, {"attn_type": "shaw", "shaw_max_dist": 5}])
def test_legacy_trainer_state_is_matched_by_name(tmp_path, overrides):
    """A trainer state written with the old rule (u/v in the decay group, no names, the parameters in the
    order of the layout that wrote it) still loads, every parameter getting its own moments."""
    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(**SMALL, **overrides))
    named = _old_layout_order(model)
    assert (named == list(model.named_parameters())) == (overrides == {})
    old = torch.optim.AdamW([{"params": [p for n, p in named if p.dim() >= 2 and "emb" not in n], "weight_decay": 0.0},
                             {"params": [p for n, p in named if not (p.dim() >= 2 and "emb" not in n)],
                              "weight_decay": 0.0}], lr=1e-3)
    x = torch.randint(0, 60, (2, 8))
    model(x, labels=x).loss.backward()
    old.step()
    scaler, gen = torch.amp.GradScaler("cpu", enabled=False), torch.Generator()
    save_trainer_state(tmp_path, optimizer=old, scaler=scaler, generator=gen, mems=None, position=0, step=1, state={})
    new = make_optimizer(model, 1e-3, 0.0)
    load_trainer_state(tmp_path, optimizer=new, scaler=scaler, generator=gen, device=torch.device("cpu"), model=model)
    for _, p in named:
        assert torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"])
    # and a state written now names its parameters, so it reloads whatever the order
    save_trainer_state(tmp_path, optimizer=new, scaler=scaler, generator=gen, mems=None, position=0, step=1, state={})
    again = make_optimizer(model, 1e-3, 0.0)
    load_trainer_state(tmp_path, optimizer=again, scaler=scaler, generator=gen, device=torch.device("cpu"))
    for _, p in named:
        assert torch.equal(again.state[p]["exp_avg_sq"], old.state[p]["exp_avg_sq"])


def test_init_weights_by_kind():
    config = TransformerXLConfig(**SMALL, **ADAPTIVE, init_std=0.5, proj_init_std=3.0)
    model = TransformerXLLM(config)
    init_weights(model, config.init_std, config.proj_init_std)
    for name, p, kind in parameter_kinds(model):
        if kind == "norm":
            assert torch.equal(p, torch.ones_like(p)), name
        elif kind == "bias":
            assert torch.equal(p, torch.zeros_like(p)), name
        elif kind == "projection":
            assert 1.5 < float(p.detach().std()) < 6.0, name
        else:
            assert 0.25 < float(p.detach().std()) < 1.0, name


def test_same_seed_same_weights_and_unknown_parameters_refused():
    config = TransformerXLConfig(**SMALL, **ADAPTIVE)
    torch.manual_seed(3)
    a = TransformerXLLM(config)
    torch.manual_seed(3)
    b = TransformerXLLM(config)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    a.extra = torch.nn.Parameter(torch.zeros(2))
    from txl.errors import TxlError
    with pytest.raises(TxlError, match="extra"):
        parameter_groups(a, 0.0)


def test_a_trainer_state_of_the_older_layout_resumes_by_name(tmp_path):
    """A trainer state written when a layer's position parameters sat on its attention
    (``layers.0.attn.r_w_bias``) resumes into today's layout (``layers.0.attn.pos.r_w_bias``): every
    parameter gets its own moments back, and the groups name today's parameters."""
    import json

    from txl.training.resume import load_trainer_state, save_trainer_state

    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(**SMALL, untie_r=True))
    opt = make_optimizer(model, 1e-3, 0.1)
    x = torch.randint(0, 60, (2, 8))
    model(x, labels=x).loss.backward()
    opt.step()
    scaler, gen = torch.amp.GradScaler("cpu", enabled=False), torch.Generator()
    save_trainer_state(tmp_path, optimizer=opt, scaler=scaler, generator=gen, mems=None, position=0, step=1, state={})
    meta = json.loads((tmp_path / "trainer.json").read_text())
    for group in meta["param_groups"]:  # the names as that layout wrote them
        group["param_names"] = [n.replace("attn.pos.", "attn.") for n in group["param_names"]]
    assert any(n.endswith("layers.0.attn.r_net.weight") for g in meta["param_groups"] for n in g["param_names"])
    (tmp_path / "trainer.json").write_text(json.dumps(meta))
    again = make_optimizer(model, 1e-3, 0.1)
    load_trainer_state(tmp_path, optimizer=again, scaler=scaler, generator=gen, device=torch.device("cpu"))
    for name, p in model.named_parameters():
        assert torch.equal(again.state[p]["exp_avg"], opt.state[p]["exp_avg"]), name
    names = [n for g in again.state_dict()["param_groups"] for n in g["param_names"]]
    assert "layers.0.attn.pos.r_w_bias" in names and not any(".attn.r_" in n for n in names)
