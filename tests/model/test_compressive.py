"""Compressive memory (Rae et al. 2019) invariants, in float64 with large random weights.

* ``cmem_len = 0`` is today's Transformer-XL: same parameters, bit-equal logits and memory;
* segments read with memory and compressed memory give the logits of :mod:`txl.model.reference`,
  which owns no memory structure: it keeps every layer input it has computed and rebuilds, for each
  segment, the keys the model should see from the positions alone (memory = the last ``mem_len``
  positions, compressed slot k = f_c of positions ``k*c .. k*c + c - 1``, the newest ``cmem_len``
  slots, pending = the evicted positions of the unfinished group), with f_c written out by hand;
* with c = 1 and mean pooling the compressed memory is a longer plain memory;
* causality; the decoding state (generation, evaluation) gives the same logits as plain calls;
* the reconstruction loss trains the compression network alone, and the LM loss never reaches it.
"""

import pytest
import torch

from conftest import run_segments, tiny_model
from test_memory_invariants import randomize
from txl.errors import TxlError
from txl.segments import decoding_state, segments
from txl.generation import generate
from txl.model import AttentionSpan, DecodingState
from txl.model import reference
from txl.model.compressive import split_mems

TOL = 1e-10
CAUGHT = 1e-4

pytestmark = pytest.mark.usefixtures("one_thread")


def build(seed=0, **overrides):
    return randomize(tiny_model(seed=seed, dtype=torch.float64, **overrides), seed)


def reference_logits(model, ids, lengths, span):
    """Logits of ``ids`` read in segments of ``lengths`` with ``span`` by :mod:`txl.model.reference`,
    which rebuilds each segment's keys from the history of layer inputs (f_c written out by hand)."""
    return reference.forward(model, ids, lengths, span).logits


def read(model, ids, lengths, span, misalign=False):
    """The model's logits and last memory; ``misalign`` drops the oldest pending state after every
    segment that leaves one (a wrong memory: the compression groups shift, to show the comparison
    with the reference catches it)."""
    mems, out, start = None, [], 0
    n_layer = model.config.n_layer
    for n in lengths:
        o = model(ids[:, start:start + n], mems=mems, span=span)
        mems, start = o.mems, start + n
        if misalign and mems[2 * n_layer].size(1) > 0:
            mems = [*mems[:2 * n_layer], *(m[:, 1:] for m in mems[2 * n_layer:])]
        out.append(o.logits)
    return torch.cat(out, 1), mems


def test_cmem_off_is_transformer_xl_bit_for_bit():
    plain = build(mem_len=5)
    assert plain.config.cmem_len == 0 and not any("compress" in k for k in plain.state_dict())
    comp = tiny_model(dtype=torch.float64, mem_len=5, cmem_len=4, cmem_ratio=2)
    missing, unexpected = comp.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(".compress." in k for k in missing)
    ids = torch.randint(0, 37, (2, 23), generator=torch.Generator().manual_seed(1))
    lengths = [4, 7, 3, 9]
    want, want_mems = run_segments(plain, ids, lengths)
    got, got_mems = read(comp, ids, lengths, comp.config.span.replace(cmem_len=0))
    assert torch.equal(want, got)
    assert len(got_mems) == plain.config.n_layer and all(torch.equal(a, b) for a, b in zip(want_mems, got_mems))


@pytest.mark.parametrize("compression", ["conv1d", "max_pool", "mean_pool"])
@pytest.mark.parametrize("overrides", [
    dict(mem_len=4, cmem_len=3, cmem_ratio=3),
    dict(mem_len=0, cmem_len=5, cmem_ratio=2),
    dict(mem_len=6, cmem_len=2, cmem_ratio=4, same_length=True, clamp_len=7),
    dict(mem_len=3, cmem_len=4, cmem_ratio=2, attn_type="shaw", shaw_max_dist=9),
    dict(mem_len=3, cmem_len=4, cmem_ratio=2, attn_type="rope"),
])
def test_segments_match_brute_force_recomputation(compression, overrides, device):
    model = build(compression=compression, **overrides).to(device)
    span = model.config.span
    ids = torch.randint(0, 37, (2, 40), generator=torch.Generator().manual_seed(2)).to(device)
    lengths = [5, 3, 7, 1, 4, 6, 2, 8, 4]  # not multiples of c: pending states are exercised
    got, mems = read(model, ids, lengths, span)
    want = reference_logits(model, ids, lengths, span)
    assert (got - want).abs().max() < TOL
    memory, compressed, pending = split_mems(mems, model.config.n_layer)
    seen = sum(lengths)
    evicted = seen - min(span.mem_len, seen)
    assert memory[0].size(1) == min(span.mem_len, seen)
    assert compressed[0].size(1) == min(span.cmem_len, evicted // model.config.cmem_ratio)
    assert pending[0].size(1) == evicted % model.config.cmem_ratio
    if overrides["mem_len"] == 4 and compression == "conv1d":  # the comparison catches a misaligned grouping
        wrong, _ = read(model, ids, lengths, span, misalign=True)
        assert (wrong - want).abs().max() > CAUGHT


def test_longer_compressed_memory_at_evaluation_matches_reference():
    model = build(mem_len=3, cmem_len=2, cmem_ratio=2)
    span = model.config.span.replace(mem_len=5, cmem_len=6)  # longer than in training
    ids = torch.randint(0, 37, (1, 30), generator=torch.Generator().manual_seed(3))
    lengths = [4] * 7 + [2]
    got, _ = read(model, ids, lengths, span)
    assert (got - reference_logits(model, ids, lengths, span)).abs().max() < TOL


def test_ratio_one_mean_pool_is_a_longer_plain_memory():
    comp = build(mem_len=3, cmem_len=4, cmem_ratio=1, compression="mean_pool")
    plain = tiny_model(dtype=torch.float64, mem_len=7)
    plain.load_state_dict(comp.state_dict())
    ids = torch.randint(0, 37, (2, 26), generator=torch.Generator().manual_seed(4))
    lengths = [5, 2, 6, 4, 5, 4]
    got, _ = read(comp, ids, lengths, comp.config.span)
    want, _ = run_segments(plain, ids, lengths)
    assert (got - want).abs().max() < TOL


def test_causality_across_compressed_memory():
    model = build(mem_len=3, cmem_len=3, cmem_ratio=2)
    ids = torch.randint(0, 37, (1, 30), generator=torch.Generator().manual_seed(5))
    lengths = [4, 5, 3, 6, 4, 5, 3]
    base, _ = read(model, ids, lengths, model.config.span)
    for t in (2, 11, 20):
        changed = ids.clone()
        changed[0, t] = (changed[0, t] + 1) % 37
        other, _ = read(model, changed, lengths, model.config.span)
        assert torch.equal(base[:, :t], other[:, :t])
        assert (base[:, t:] - other[:, t:]).abs().max() > CAUGHT


def test_decoding_state_equals_plain_calls():
    model = build(mem_len=4, cmem_len=3, cmem_ratio=3)
    span = model.config.span
    ids = torch.randint(0, 37, (2, 21), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        plain = [s.output.logits for s in segments(model, ids, span=span.replace(tgt_len=5))]
        state = decoding_state(model, span.replace(tgt_len=5))
        cached = [s.output.logits for s in segments(model, ids, span=span.replace(tgt_len=5), caches=state)]
        assert all(torch.equal(a, b) for a, b in zip(plain, cached))
        # one token at a time (generation's steps) after a primed state, against plain calls
        state = DecodingState(model.config.n_layer, span)
        model(ids[:, :7], caches=state)
        mems = model(ids[:, :7]).mems
        for t in range(7, 21):
            a = model(ids[:, t:t + 1], caches=state).logits
            out = model(ids[:, t:t + 1], mems=mems)
            mems = out.mems
            assert torch.equal(a, out.logits)
        assert all(torch.equal(a, b) for a, b in zip(state.mems(), mems))


def test_cached_generation_equals_uncached():
    """generate() (a DecodingState) against the same protocol with plain calls: the prompt but its last
    token in segments of tgt_len, then one token per call, the memory carried by hand."""
    model = build(mem_len=3, cmem_len=2, cmem_ratio=2)
    prompt = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(7))
    got = generate(model, prompt, 12, temperature=0.0)
    seq, mems = prompt, None
    with torch.no_grad():
        for s in segments(model, prompt[:, :-1], span=model.config.span):
            mems = s.output.mems
        for _ in range(12):
            out = model(seq[:, -1:], mems=mems)
            mems = out.mems
            seq = torch.cat([seq, out.logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(got, seq)


def test_reconstruction_loss_trains_only_the_compression_network():
    model = build(mem_len=2, cmem_len=3, cmem_ratio=2)
    model.train()
    ids = torch.randint(0, 37, (2, 12), generator=torch.Generator().manual_seed(8))
    mems = model(ids[:, :4]).mems
    out = model(ids[:, 4:8], mems=mems, labels=ids[:, 5:9])
    assert out.recon_loss is not None and float(out.recon_loss.detach()) > 0
    out.recon_loss.backward(retain_graph=True)
    for name, p in model.named_parameters():
        if ".compress." in name:
            assert p.grad is not None and p.grad.abs().max() > 0, name
        else:
            assert p.grad is None or not p.grad.any(), name
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    for name, p in model.named_parameters():
        if ".compress." in name:
            assert p.grad is None or not p.grad.any(), name
    with torch.no_grad():
        assert model(ids[:, 4:8], mems=mems).recon_loss is None  # evaluation computes none


def test_reconstruction_loss_is_zero_for_an_exact_compression():
    model = build(mem_len=2, cmem_len=4, cmem_ratio=1, compression="mean_pool")
    ids = torch.randint(0, 37, (1, 10), generator=torch.Generator().manual_seed(9))
    mems = model(ids[:, :5]).mems
    assert float(model(ids[:, 5:], mems=mems).recon_loss) == 0.0


def test_bad_compressive_input_is_refused():
    plain = build(mem_len=3)
    with pytest.raises(TxlError, match="needs a model with a compressed memory"):
        plain(torch.zeros(1, 3, dtype=torch.long), span=plain.config.span.replace(cmem_len=2))
    model = build(mem_len=3, cmem_len=2, cmem_ratio=2)
    mems = model(torch.zeros(1, 5, dtype=torch.long)).mems
    with pytest.raises(TxlError, match="3 × 3 tensors"):
        model(torch.zeros(1, 3, dtype=torch.long), mems=mems[:4])
    with pytest.raises(TxlError, match="pending"):
        model(torch.zeros(1, 3, dtype=torch.long), mems=mems[:6] + [m.new_zeros(1, 2, m.size(2)) for m in mems[6:]])
    with pytest.raises(TxlError, match="cmem_len"):
        AttentionSpan(4, 4, cmem_len=-1)
    with pytest.raises(TxlError, match="attn_type"):
        tiny_model(attn_type="abs", cmem_len=2)
    # a plain memory starts a compressive reading (no compressed states yet)
    plain_mems = model(torch.zeros(1, 5, dtype=torch.long), span=model.config.span.replace(cmem_len=0)).mems
    assert len(model(torch.zeros(1, 2, dtype=torch.long), mems=plain_mems).mems) == 9


RUN_ARGS = ["model.n_layer=2", "model.d_model=16", "model.n_head=2", "model.d_head=8", "model.d_inner=32",
            "model.tgt_len=8", "model.mem_len=4", "model.cmem_len=4", "model.cmem_ratio=3", "model.dropout=0.1",
            "train.batch_size=4", "train.max_steps=24", "train.eval_interval=8", "train.log_interval=1",
            "train.sample_tokens=8", "train.warmup_steps=2", "train.tgt_len_schedule=[[0, 6], [10, 8]]",
            "train.varlen=true", "eval.cmem_len=6", "eval.max_tokens=200"]


def test_training_resume_and_commands_with_compressed_memory(tmp_path, monkeypatch, capsys):
    """Progressive segments with variable lengths (pending states), exact resume from last/ (the
    compressive memory is in the trainer state), the reconstruction loss logged and training the
    compression network; eval with a longer compressed memory; to-hf refuses."""
    import csv
    import json

    import txl.training.loop as loop
    from conftest import one_error_line, run_cli
    from txl.cli import main
    from txl.training.checkpoint import load_checkpoint
    from txl.config import load_run_config
    from txl.training.loop import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps.\n" for i in range(300)))

    def run(name):
        return load_run_config(None, [f"data.path={corpus}", "data.tokenizer=char", f"data.cache_dir={tmp_path / 'c'}",
                                      f"train.out_dir={tmp_path / name}", *RUN_ARGS])

    def rows(name):
        return {int(r["step"]): r for r in csv.DictReader(open(tmp_path / name / "metrics.csv"))}

    result = train(run("straight"), progress=False, log=lambda m: None)
    assert result.final.settings["cmem_len"] == 6
    real_lr = loop.learning_rate

    def crash(step, **kw):
        if step == 20:
            raise RuntimeError("simulated crash")
        return real_lr(step, **kw)

    monkeypatch.setattr(loop, "learning_rate", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(run("crashed"), progress=False, log=lambda m: None)
    monkeypatch.setattr(loop, "learning_rate", real_lr)
    assert json.loads((tmp_path / "crashed" / "last" / "trainer.json").read_text())["n_mems"] == 6
    assert main(["train", "--resume", str(tmp_path / "crashed"), "-q"]) == 0
    straight, resumed = rows("straight"), rows("crashed")
    assert all(straight[s]["train_loss"] == resumed[s]["train_loss"] for s in range(17, 25))
    assert all(straight[s]["recon_loss"] == resumed[s]["recon_loss"] for s in range(17, 25))
    assert float(straight[24]["recon_loss"]) > 0
    assert load_checkpoint(tmp_path / "straight" / "best").model.config.cmem_len == 4
    capsys.readouterr()

    code, out, err = run_cli(capsys, "eval", tmp_path / "straight", "--cmem-len", "9", "--mem-len", "6", "--json")
    assert code == 0 and '"cmem_len": 9' in out and '"mem_len": 6' in out
    code, out, err = run_cli(capsys, "convert", "to-hf", tmp_path / "straight", tmp_path / "hf")
    assert code != 0 and "compressed memory" in one_error_line(err) and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_train_step_weights_the_reconstruction_loss(weight):
    """One optimizer step: the compression network moves only through recon_loss_weight × recon_loss
    (plain SGD, no weight decay); the LM loss sum is the same either way."""
    from txl.training.step import train_step

    model = build(mem_len=2, cmem_len=3, cmem_ratio=2, recon_loss_weight=weight)
    model.train()
    ids = torch.randint(0, 37, (4, 13), generator=torch.Generator().manual_seed(10))
    mems = model(ids[:, :6]).mems
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = train_step(model, ids[:, 6:12], ids[:, 7:13], mems, n_global=torch.tensor(24), optimizer=optimizer,
                     scaler=torch.amp.GradScaler("cpu", enabled=False), clip=0.0, dtype="float32", chunks=2)
    assert out.recon_loss is not None and float(out.recon_loss) > 0 and len(out.mems) == 9
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    compress = {k for k in before if ".compress." in k}
    assert (compress <= moved) if weight else not (compress & moved)
    assert moved - compress  # the LM loss trains the rest


def test_ablation_variant_attention_mass_and_classification():
    """txl ablate's compressive variant keeps the attention span and the parameter count; the
    attention share of the compressed slots is a probability mass; a classifier reads with it."""
    import numpy as np

    from txl_studies.ablation.table import COMPRESSIVE, VARIANTS, evaluate_variant, plan_variants
    from txl_recipes.plot.attention import compressed_attention_mass
    from txl.evaluation.stream import evaluate
    from txl.config import RunConfig

    base = RunConfig.from_dict({"model": {"n_layer": 2, "d_model": 16, "n_head": 2, "d_head": 8, "d_inner": 64,
                                          "tgt_len": 8, "mem_len": 8}})
    planned = plan_variants(base, 40, VARIANTS[:1] + (COMPRESSIVE,))
    (_, xl, n_xl), (_, cm, n_cm) = planned
    assert (cm.mem_len, cm.cmem_len, cm.cmem_ratio, xl.cmem_len) == (4, 4, 3, 0)
    assert abs(n_xl - n_cm) <= cm.n_layer * (2 * cm.d_model + 1) // 2
    model = build(mem_len=4, cmem_len=4, cmem_ratio=2, tgt_len=4)
    tokens = np.random.default_rng(0).integers(0, 37, size=60)
    res = evaluate_variant(model, tokens, COMPRESSIVE, 10, "bpc", tgt_len=4, max_tokens=50)
    same = evaluate(model, tokens, unit="bpc", batch_size=1, tgt_len=4, mem_len=5, cmem_len=5, same_length=True,
                    max_tokens=50)
    assert res.loss == same.loss and res.settings["cmem_len"] == 5
    mass = compressed_attention_mass(model, tokens, max_segments=10)
    assert mass.shape == (3, 2) and (mass > 0).all() and (mass < 1).all()
    with pytest.raises(TxlError, match="without a compressed memory"):
        compressed_attention_mass(model, tokens, cmem_len=0)

    from txl.classification.model import TransformerXLForSequenceClassification

    clf = TransformerXLForSequenceClassification(model.config, 3).double()
    clf.body.load_state_dict(model.state_dict())
    logits = clf(torch.randint(0, 37, (2, 19)), lengths=torch.tensor([19, 7])).logits
    logits.sum().backward()
    assert logits.shape == (2, 3)
