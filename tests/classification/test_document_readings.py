"""Readings of a whole document by the classifier: the pooled vector every segment feeds ("document", "attention"),
ERNIE-Doc's retrospective feed (two passes) and enhanced (same-layer) recurrence, against one-pass computations in
float64, and the reach of each reading: what a change in the first segment of a long document does to the logits."""

import dataclasses

import numpy as np
import pytest
import torch

from conftest import tiny_config
from txl.classification import TransformerXLForSequenceClassification
from txl.classification.data import pad_batch
from txl.config import ClassifierConfig
from txl.errors import TxlError

pytestmark = pytest.mark.usefixtures("one_thread")


def _classifier(tgt_len=5, mem_len=7, seed=0, **settings):
    """A float64 classifier in eval mode (no dropout) with a head and pooling query of real size."""
    torch.manual_seed(seed)
    model = TransformerXLForSequenceClassification(tiny_config(tgt_len=tgt_len, mem_len=mem_len), 3,
                                                   classifier_dropout=0.0, **settings)
    torch.nn.init.normal_(model.head.weight, 0.0, 1.0)
    if hasattr(model, "pool_query"):
        torch.nn.init.normal_(model.pool_query, 0.0, 0.5)
    return model.to(torch.float64).eval()


def _same_weights(model, **config):
    """``model`` reading with another span (one segment for a whole document, say): the same weights."""
    other = TransformerXLForSequenceClassification(dataclasses.replace(model.config, **config),
                                                   classifier=model.classifier).to(torch.float64).eval()
    other.load_state_dict(model.state_dict())
    return other


DOCS = [np.random.default_rng(k).integers(1, 37, n) for k, n in enumerate((23, 7, 40, 12, 31))]


@pytest.mark.parametrize("pooling", ["document", "attention"])
def test_the_pooled_vector_read_segment_by_segment_equals_one_pass_over_the_document(pooling):
    # with a memory as long as the document, segment after segment is one causal pass (paper §3.2), and a pool
    # fed by every segment is then the pool of that pass's states: the running sum and the running softmax exact
    model = _classifier(mem_len=64, pooling=pooling)
    whole = _same_weights(model, tgt_len=64)
    ids, lengths = pad_batch(DOCS)
    with torch.no_grad():
        by_segments = model.encode(ids, lengths)
        one_pass = whole.encode(ids, lengths)
        torch.testing.assert_close(by_segments, one_pass, rtol=0, atol=1e-12)
        # and by hand: the mean (or the softmax-weighted mean) of the last layer's states over the real tokens
        for row, doc in enumerate(DOCS):
            h, _ = whole.body.hidden_states(torch.as_tensor(doc)[None], None)
            h = h[0]
            if pooling == "document":
                want = h.mean(0)
            else:
                want = torch.softmax(h @ model.pool_query, 0) @ h
            torch.testing.assert_close(by_segments[row], want, rtol=0, atol=1e-12)


def test_the_retrospective_feed_equals_reading_the_document_after_its_own_memory():
    # passes=2: the second reading starts from the memory the first left; with a memory holding the whole
    # document twice, one pass of the document after its own first reading is the same computation
    model = _classifier(mem_len=128, passes=2)
    whole = _same_weights(model, tgt_len=64)
    ids, lengths = pad_batch(DOCS)
    with torch.no_grad():
        got = model.encode(ids, lengths)
        for row, doc in enumerate(DOCS):
            x = torch.as_tensor(doc)[None]
            _, memory = whole.body.hidden_states(x, None)
            h, _ = whole.body.hidden_states(x, memory)
            torch.testing.assert_close(got[row], h[0].mean(0), rtol=0, atol=1e-12)
        assert (got - model.encode(ids, lengths) == 0).all()  # (rows grouped by memory length: same as alone)
        for row, doc in enumerate(DOCS):
            torch.testing.assert_close(model.encode(torch.as_tensor(doc)[None])[0], got[row], rtol=0, atol=1e-12)


@pytest.mark.parametrize("recurrence", ["previous_layer", "same_layer"])
def test_the_retrospective_feed_does_not_depend_on_the_rows_beside_it(recurrence):
    # a row's last segment holds padding after its end: the memory its first reading leaves must be its own
    # last mem_len states, not the padding's, with a memory shorter than a segment plus that padding
    model = _classifier(tgt_len=5, mem_len=7, passes=2, recurrence=recurrence)
    ids, lengths = pad_batch(DOCS)
    with torch.no_grad():
        batched = model.encode(ids, lengths)
        for row, doc in enumerate(DOCS):
            torch.testing.assert_close(model.encode(torch.as_tensor(doc)[None])[0], batched[row], rtol=0, atol=1e-12)
    with pytest.raises(TxlError, match="passes=2 needs mem_len >= tgt_len"):
        _classifier(tgt_len=8, mem_len=4, passes=2).encode(ids, lengths)


def test_same_layer_recurrence_remembers_each_layers_output():
    model = _classifier(recurrence="same_layer").body
    x = torch.as_tensor(DOCS[0][:5])[None]
    with torch.no_grad():
        h, paper = model.hidden_states(x, None)
        _, own = model.hidden_states(x, None, same_layer=True)
        for i in range(model.config.n_layer - 1):  # layer i's own output is what layer i + 1 read
            torch.testing.assert_close(own[i], paper[i + 1], rtol=0, atol=0)
        torch.testing.assert_close(own[-1], h, rtol=0, atol=0)  # (no dropout in eval mode)


@pytest.mark.parametrize("settings,reaches", [
    (dict(pooling="last"), False), (dict(pooling="mean"), False),  # the last segment: n_layer x mem_len back at most
    (dict(pooling="document"), True), (dict(pooling="attention"), True),
    # the retrospective feed starts from the memory at the document's end, which the paper's recurrence fills
    # from its last n_layer x mem_len tokens only; with same-layer memory the first word reaches it
    (dict(pooling="last", passes=2), False), (dict(pooling="last", passes=2, recurrence="same_layer"), True),
    (dict(pooling="last", recurrence="same_layer"), True),
])
def test_a_word_in_the_first_segment_of_a_long_document_reaches_the_logits(settings, reaches):
    # 3 layers x 7 memory + a segment of 5: 26 tokens of reach; the document is 80 tokens long. In float64 a
    # state that the word cannot reach is computed from the same numbers in the same order: equal to the bit
    model = _classifier(**settings)
    doc = np.random.default_rng(9).integers(1, 37, 80)
    changed = doc.copy()
    changed[2] = changed[2] % 36 + 1
    with torch.no_grad():
        a, b = (model(torch.as_tensor(d)[None]).logits for d in (doc, changed))
    assert bool((a != b).any()) == reaches, (a - b).abs().max()


def test_gradients_flow_from_the_last_k_segments_and_the_earlier_ones_still_count():
    model = _classifier(pooling="document", grad_segments=2)
    model.train()
    doc = torch.as_tensor(np.random.default_rng(3).integers(1, 37, 30))[None]  # 6 segments of 5
    out = model(doc, labels=torch.tensor([1]))
    out.loss.backward()
    assert model.body.word_emb.emb_layers[0].weight.grad.abs().sum() > 0
    with torch.no_grad():  # the pooled vector is the mean over all 30 tokens, not over the last 2 segments
        model.eval()
        whole = _same_weights(model, tgt_len=64, mem_len=64)
        h, _ = whole.body.hidden_states(doc, None)
        near = model.encode(doc)
        assert (near - h[0].mean(0)).abs().max() < (near - h[0, -10:].mean(0)).abs().max()


def test_old_classifier_settings_keep_their_reading_and_bad_ones_are_refused():
    # a classifier.json without passes, recurrence and head_init: pooling as it says, one pass, the paper's
    # memory, a head that was trained from random (no standardization)
    old = ClassifierConfig.from_dict({"num_labels": 2, "labels": ["a", "b"], "mode": "memory", "pooling": "mean",
                                      "grad_segments": 2, "classifier_dropout": 0.1, "max_tokens": None})
    assert (old.pooling, old.passes, old.recurrence, old.head_init) == ("mean", 1, "previous_layer", "random")
    assert ClassifierConfig(num_labels=2).pooling == "document"
    for settings, said in ((dict(passes=3), "passes must be 1 or 2"), (dict(recurrence="next"), "recurrence must be"),
                           (dict(mode="first", passes=2), "passes=2 reads with the memory: it needs mode='memory'"),
                           (dict(pooling="max"), "pooling must be one of")):
        with pytest.raises(TxlError, match=said):
            ClassifierConfig(num_labels=2, **settings)


@pytest.mark.parametrize("pooling", ["document", "attention"])
def test_a_rows_gradient_does_not_depend_on_the_rows_beside_it(pooling):
    # a segment runs with autograd when any of its rows is inside its gradient window: a row not yet inside
    # its own must still enter the pool as a constant, or its gradient would change with its neighbours
    model = _classifier(pooling=pooling, grad_segments=2)
    model.train()  # (no dropout in the tiny config)

    def grads(docs):
        model.zero_grad()
        ids, lengths = pad_batch(docs)
        model(ids, lengths).logits[0].sum().backward()  # the first document's logits only
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    alone = grads([DOCS[2]])
    beside = grads([DOCS[2], DOCS[0], DOCS[4]])  # documents ending sooner: their windows start earlier
    torch.testing.assert_close(beside, alone, rtol=0, atol=1e-12)


def test_a_classifier_saved_without_passes_recurrence_and_head_init_keeps_its_reading(tmp_path):
    # classifier.json of a last-segment classifier without the fields passes, recurrence and head_init
    import json

    model = _classifier(pooling="mean", grad_segments=2, head_init="random").float()
    model.save_pretrained(tmp_path / "clf")
    saved = json.loads((tmp_path / "clf" / "classifier.json").read_text())
    for key in ("passes", "recurrence", "head_init"):
        del saved[key]
    (tmp_path / "clf" / "classifier.json").write_text(json.dumps(saved))
    sums = tmp_path / "clf" / "checksums.json"
    if sums.is_file():  # (the folder's own record of its files, made anew for the edit)
        from txl.fileio import sha256_file

        sums.write_text(json.dumps({**json.loads(sums.read_text()),
                                    "classifier.json": sha256_file(tmp_path / "clf" / "classifier.json")}))
    loaded = TransformerXLForSequenceClassification.from_pretrained(tmp_path / "clf")
    c = loaded.classifier
    assert (c.pooling, c.passes, c.recurrence, c.head_init) == ("mean", 1, "previous_layer", "random")
    ids, lengths = pad_batch(DOCS)
    with torch.no_grad():
        want = torch.stack([  # by hand: the document read with the memory, the mean over its last segment
            model.head(_last_segment_mean(model, doc)) for doc in DOCS])
        torch.testing.assert_close(loaded(ids, lengths).logits, want, rtol=1e-5, atol=1e-5)


def _last_segment_mean(model, doc):
    mems, start = None, 0
    for start in range(0, len(doc), model.config.tgt_len):
        h, mems = model.body.hidden_states(torch.as_tensor(doc[start:start + model.config.tgt_len])[None], mems)
    return h[0].mean(0)


# --- the head's start: a linear probe over the pooled vectors ----------------------------------------------------

def test_the_probe_is_scikit_learns_logistic_regression_on_standardized_features():
    sklearn = pytest.importorskip("sklearn")  # noqa: F841 - the oracle (the bench and test extras)
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    from txl_recipes.classify.probe import fit_probe

    g = np.random.default_rng(0)
    centres = g.normal(0, 1, (4, 12))
    y = g.integers(0, 4, 300)
    x = centres[y] * 0.05 + g.normal(0, 0.1, (300, 12)) * np.logspace(-3, 1, 12)  # features of very unequal scales
    shift, scale, weight, bias = fit_probe(torch.as_tensor(x), y.tolist(), 4)
    z = StandardScaler().fit_transform(x)
    np.testing.assert_allclose(((torch.as_tensor(x) - shift) * scale).numpy(), z, atol=1e-10)
    want = LogisticRegression(C=1.0, max_iter=10_000, tol=1e-10).fit(z, y).predict_proba(z)
    got = torch.softmax(torch.as_tensor(z) @ weight.T + bias, -1).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_probed_classifier_starts_from_the_probes_logits(tmp_path):
    from txl_recipes.classify.probe import pooled_vectors, probe_head

    model = _classifier(pooling="document")
    labels = [0, 1, 2, 0, 1]
    probe_head(model, DOCS, labels)
    x = pooled_vectors(model, DOCS)
    ids, lengths = pad_batch(DOCS)
    with torch.no_grad():
        logits = model(ids, lengths).logits
        torch.testing.assert_close(logits, ((x - model.pool_shift) * model.pool_scale) @ model.head.weight.T
                                   + model.head.bias, rtol=0, atol=1e-10)
    assert (logits.argmax(1) == torch.tensor(labels)).all()  # 5 documents, 16 features: separable
    model.save_pretrained(tmp_path / "clf")  # the standardization is saved with the weights
    loaded = TransformerXLForSequenceClassification.from_pretrained(tmp_path / "clf").to(torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, lengths).logits, logits, rtol=0, atol=1e-6)  # (saved as float64)
    with pytest.raises(TxlError, match="starts at random"):
        probe_head(_classifier(head_init="random"), DOCS, labels)
