"""Tests for txl.model.adaptive: adaptive input embeddings and the projected adaptive softmax."""

import math

import pytest
import torch
import torch.fx.experimental._config as fx_config
from torch.utils._python_dispatch import TorchDispatchMode

from txl.errors import TxlError
from txl.model.adaptive import IGNORE_INDEX, AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, tie_adaptive

V = 30
CUTOFFS = [5, 10, 20]
# (d_embed, d_proj, cutoffs, div_val)
CONFIGS = [
    (8, 8, [], 1),
    (8, 6, [], 1),
    (8, 8, CUTOFFS, 1),
    (8, 6, CUTOFFS, 1),
    (64, 64, CUTOFFS, 4),
    (64, 12, CUTOFFS, 4),
]
IDS = [f"e{d}-p{p}-c{len(c)}-div{k}" for d, p, c, k in CONFIGS]


def randomized(module, seed=0):
    """Give every parameter (biases and cluster logits included, which init at 0) random values,
    scaled by fan-in so that logits stay O(1) and the softmax is not saturated."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.dim() == 1 or "emb_layers" in name:
                fan_in = 1
            else:  # projections [d_proj, d_i] contract over d_proj, linear weights over dim 1
                fan_in = param.shape[0] if "projs" in name else param.shape[1]
            param.copy_(torch.randn(param.shape, generator=gen) / fan_in ** 0.5)
    return module


def make_crit(d_embed, d_proj, cutoffs, div_val, seed=0, vocab=V):
    return randomized(ProjectedAdaptiveLogSoftmax(vocab, d_embed, d_proj, cutoffs, div_val), seed)


def labels_covering_every_cluster(cutoffs, n_random=40, seed=0, vocab=V):
    gen = torch.Generator().manual_seed(seed)
    bounds = [0, *cutoffs, vocab]
    edges = [t for lo, hi in zip(bounds, bounds[1:]) for t in (lo, hi - 1)]
    labels = torch.cat([torch.tensor(edges), torch.randint(0, vocab, (n_random,), generator=gen)])
    labels[3::7] = IGNORE_INDEX
    return labels


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_log_prob_rows_sum_to_one(cfg):
    crit = make_crit(*cfg)
    lp = crit.log_prob(torch.randn(17, cfg[1]) * 3)
    assert lp.shape == (17, V) and lp.dtype == torch.float32
    torch.testing.assert_close(lp.exp().sum(1), torch.ones(17), atol=1e-5, rtol=0)
    assert (lp <= 0).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_forward_equals_log_prob_gathered(cfg):
    crit = make_crit(*cfg)
    labels = labels_covering_every_cluster(cfg[2])
    hidden = torch.randn(len(labels), cfg[1]) * 3
    nll = crit(hidden, labels)
    valid = labels != IGNORE_INDEX
    assert nll.shape == labels.shape and nll.dtype == torch.float32
    expected = -crit.log_prob(hidden)[valid].gather(1, labels[valid, None]).squeeze(1)
    torch.testing.assert_close(nll[valid], expected, atol=1e-5, rtol=0)
    assert (nll[~valid] == 0).all() and (nll[valid] > 0).all()


@pytest.mark.parametrize("div_val,d_embed", [(1, 8), (4, 64)])
@pytest.mark.parametrize("cluster", [0, 1, 2, 3])
def test_labels_in_a_single_cluster(cluster, div_val, d_embed):
    crit = make_crit(d_embed, 6, CUTOFFS, div_val)
    bounds = [0, *CUTOFFS, V]
    labels = torch.randint(bounds[cluster], bounds[cluster + 1], (9,))
    hidden = torch.randn(9, 6)
    expected = -crit.log_prob(hidden).gather(1, labels[:, None]).squeeze(1)
    torch.testing.assert_close(crit(hidden, labels), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", [CONFIGS[1], CONFIGS[3], CONFIGS[5]], ids=[IDS[1], IDS[3], IDS[5]])
def test_ignored_positions_are_zero_without_gradient(cfg):
    crit = make_crit(*cfg)
    labels = labels_covering_every_cluster(cfg[2])
    hidden = torch.randn(len(labels), cfg[1], requires_grad=True)
    crit(hidden, labels).sum().backward()
    ignored = labels == IGNORE_INDEX
    assert ignored.sum() > 0
    assert (hidden.grad[ignored] == 0).all()
    assert (hidden.grad[~ignored].abs().sum(1) > 0).all()


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_all_ignored_gives_zeros(cfg):
    crit = make_crit(*cfg)
    hidden = torch.randn(6, cfg[1], requires_grad=True)
    nll = crit(hidden, torch.full((6,), IGNORE_INDEX))
    assert torch.equal(nll, torch.zeros(6))
    nll.sum().backward()
    assert torch.equal(hidden.grad, torch.zeros_like(hidden))


@pytest.mark.parametrize("cfg", [CONFIGS[3], CONFIGS[5]], ids=[IDS[3], IDS[5]])
def test_output_order_follows_input_order(cfg):
    crit = make_crit(*cfg)
    labels = labels_covering_every_cluster(cfg[2])
    hidden = torch.randn(len(labels), cfg[1])
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1))
    permuted = crit(hidden[perm], labels[perm])
    torch.testing.assert_close(permuted, crit(hidden, labels)[perm], atol=1e-6, rtol=0)


def naive_log_probs(state, h, vocab, cutoffs, div_val):
    """log p(y | h) for every y, from the state dict, as a plain float64 loop over tokens and classes."""
    bounds = [0, *cutoffs, vocab]
    n_tail = len(cutoffs)

    def cluster_params(i):
        if div_val == 1:
            w, b = state["out_layers.0.weight"][bounds[i]:bounds[i + 1]], state["out_layers.0.bias"]
            return w, b[bounds[i]:bounds[i + 1]], state.get(f"out_projs.{i}")
        return state[f"out_layers.{i}.weight"], state[f"out_layers.{i}.bias"], state[f"out_projs.{i}"]

    def log_softmax(scores):
        top = max(scores)
        log_z = top + math.log(sum(math.exp(s - top) for s in scores))
        return [s - log_z for s in scores]

    def scores(x, w, b, proj):
        if proj is not None:
            x = [sum(float(x[k]) * float(proj[k, e]) for k in range(len(x))) for e in range(proj.shape[1])]
        return [sum(float(w[j, e]) * x[e] for e in range(len(x))) + float(b[j]) for j in range(w.shape[0])]

    out = []
    for row in h.double():
        w0, b0, p0 = cluster_params(0)
        head = scores(row, w0, b0, p0)
        if n_tail:
            x0 = row if p0 is None else [sum(float(row[k]) * float(p0[k, e]) for k in range(len(row)))
                                         for e in range(p0.shape[1])]
            head += [sum(float(state["cluster_weight"][c, e]) * float(x0[e]) for e in range(len(x0)))
                     + float(state["cluster_bias"][c]) for c in range(n_tail)]
        head = log_softmax(head)
        logp = head[:bounds[1]]
        for i in range(1, n_tail + 1):  # tail cluster i has head column shortlist + i - 1
            tail = log_softmax(scores(row, *cluster_params(i)))
            logp += [head[bounds[1] + i - 1] + t for t in tail]
        out.append(logp)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("d_embed,d_proj,cutoffs,div_val",
                         [(6, 4, [3, 7], 1), (8, 5, [3, 7], 2), (6, 6, [], 1)])
def test_matches_naive_two_level_softmax(d_embed, d_proj, cutoffs, div_val):
    vocab = 12
    crit = make_crit(d_embed, d_proj, cutoffs, div_val, vocab=vocab, seed=3)
    hidden = torch.randn(5, d_proj) * 2
    state = {k: v.double() for k, v in crit.state_dict().items()}
    expected = naive_log_probs(state, hidden, vocab, cutoffs, div_val)
    torch.testing.assert_close(crit.log_prob(hidden).double(), expected, atol=1e-5, rtol=0)
    labels = torch.tensor([0, vocab - 1, 4, 8, 2])
    nll = crit(hidden, labels).double()
    torch.testing.assert_close(nll, -expected.gather(1, labels[:, None]).squeeze(1), atol=1e-5, rtol=0)
    # float64 end to end matches to rounding error
    torch.testing.assert_close(crit.double().log_prob(hidden.double()), expected, atol=1e-10, rtol=0)


def test_tail_cluster_i_uses_cluster_row_i_minus_1():
    """Natural cluster order (HF 4.35.2 forward, authors' TF); the authors' PyTorch code is reversed."""
    crit = ProjectedAdaptiveLogSoftmax(V, 8, 8, CUTOFFS, div_val=1)
    with torch.no_grad():
        for p in crit.parameters():
            p.zero_()
        crit.cluster_bias.copy_(torch.tensor([9.0, 0.0, 0.0]))
    probs = crit.log_prob(torch.randn(2, 8)).exp()
    assert (probs[:, 5:10].sum(1) > 0.99).all()  # tail cluster 1 = ids [5, 10)


def hf_oracle_state(ours, d_embed, d_proj, cutoffs, div_val):
    """Our state dict under HF's names: the keys are the same."""
    return dict(ours.state_dict())


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_matches_hf_projected_adaptive_log_softmax(cfg):
    from transformers.models.transfo_xl import modeling_transfo_xl_utilities as hf_utils
    d_embed, d_proj, cutoffs, div_val = cfg
    ours = make_crit(*cfg, seed=5)
    hf = hf_utils.ProjectedAdaptiveLogSoftmax(V, d_embed, d_proj, list(cutoffs), div_val=div_val)
    hf.load_state_dict(hf_oracle_state(ours, *cfg), strict=True)
    hidden = torch.randn(11, d_proj) * 2
    with torch.no_grad():
        torch.testing.assert_close(ours.log_prob(hidden), hf(hidden, labels=None), atol=1e-5, rtol=0)


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_adaptive_embedding_matches_hf(cfg):
    from transformers.models.transfo_xl import modeling_transfo_xl as hf_model
    d_embed, d_proj, cutoffs, div_val = cfg
    ours = randomized(AdaptiveEmbedding(V, d_embed, d_proj, cutoffs, div_val), seed=7)
    hf = hf_model.AdaptiveEmbedding(V, d_embed, d_proj, list(cutoffs), div_val=div_val)
    hf.load_state_dict(ours.state_dict(), strict=True)
    ids = torch.randint(0, V, (4, 9))
    out = ours(ids)
    assert out.shape == (4, 9, d_proj)
    with torch.no_grad():
        torch.testing.assert_close(out, hf(ids), atol=1e-6, rtol=0)


def test_embedding_scale_and_init():
    emb = AdaptiveEmbedding(V, 64, 16, CUTOFFS, div_val=4, init_std=0.02, proj_init_std=0.01)
    assert [tuple(layer.weight.shape) for layer in emb.emb_layers] == [(5, 64), (5, 16), (10, 4), (10, 1)]
    assert [tuple(p.shape) for p in emb.emb_projs] == [(16, 64), (16, 16), (16, 4), (16, 1)]
    assert 0.01 < emb.emb_layers[0].weight.std() < 0.03
    ids = torch.tensor([2, 7])
    expected = torch.stack([emb.emb_projs[0] @ emb.emb_layers[0].weight[2],   # id 2: cluster 0, row 2
                            emb.emb_projs[1] @ emb.emb_layers[1].weight[2]])  # id 7: cluster 1, row 2
    torch.testing.assert_close(emb(ids), expected * 4.0)


@pytest.mark.parametrize("d_embed,d_proj,div_val", [(16, 8, 1), (8, 8, 1), (16, 8, 2)])
def test_bf16_autocast(d_embed, d_proj, div_val):
    torch.manual_seed(0)
    emb = AdaptiveEmbedding(V, d_embed, d_proj, CUTOFFS, div_val)
    crit = ProjectedAdaptiveLogSoftmax(V, d_embed, d_proj, CUTOFFS, div_val)
    body = torch.nn.Linear(d_proj, d_proj)
    params = [*emb.parameters(), *crit.parameters(), *body.parameters()]
    with torch.no_grad():  # larger weights, so the NLLs (up to ~5 nats) are far from uniform
        for p in params:
            p.normal_(0.0, 0.2)
    ids = torch.randint(0, V, (3, 8))
    labels = labels_covering_every_cluster(CUTOFFS, n_random=16)[:24]

    def run(bf16):
        for p in params:
            p.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            x = emb(ids)
            if bf16 and d_proj != d_embed:
                assert x.dtype == torch.bfloat16  # the masked sum takes the projected chunks' dtype
            hidden = body(x).reshape(-1, d_proj)
            nll = crit(hidden, labels)
            lp = crit.log_prob(hidden)
        nll.mean().backward()
        return nll.detach(), lp.detach(), torch.cat([p.grad.flatten() for p in params])

    nll, lp, grads = run(True)
    nll32, lp32, grads32 = run(False)
    assert nll.dtype == torch.float32 and lp.dtype == torch.float32
    assert (nll[labels == IGNORE_INDEX] == 0).all()
    torch.testing.assert_close(lp.exp().sum(1), torch.ones(24), atol=1e-5, rtol=0)
    # against float32: bf16 keeps 8 significant bits (unit roundoff u = 2^-8 = 0.0039) and the
    # inputs of the matmuls are rounded, so a logit of size ~5 may be off by ~u * 5 = 0.02 nats:
    # that is the bound for NLLs and log-probabilities (measured <= 0.005 over three seeds), and
    # 5u = 2% for the gradient norm (measured <= 0.5%)
    keep = labels != IGNORE_INDEX
    assert (nll[keep] - nll32[keep]).abs().max() < 0.02
    assert (lp - lp32).abs().max() < 0.02
    assert (grads - grads32).norm() < 0.02 * grads32.norm()


class MaxNumel(TorchDispatchMode):
    """Records the largest tensor any aten op produces."""

    def __init__(self):
        super().__init__()
        self.max_numel, self.max_shape = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.numel() > self.max_numel:
                self.max_numel, self.max_shape = t.numel(), tuple(t.shape)
        return out


def test_wt103_scale_loss_never_builds_n_by_vocab_on_meta():
    vocab, cutoffs, n = 267735, [20000, 40000, 200000], 4096
    with torch.device("meta"):
        emb = AdaptiveEmbedding(vocab, 1024, 1024, cutoffs, div_val=4)
        crit = ProjectedAdaptiveLogSoftmax(vocab, 1024, 1024, cutoffs, div_val=4)
        ids = torch.randint(0, vocab, (n,))
    # Meta tensors carry no values, so nonzero() cannot know which rows are in a cluster; this flag
    # makes it return every row: each tail cluster sees all n rows (the worst case for memory).
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True), MaxNumel() as probe:
        hidden = emb(ids)
        nll = crit(hidden, ids)
    assert hidden.shape == (n, 1024) and nll.shape == (n,)
    largest_cluster = max(b - a for a, b in zip([0, *cutoffs], [*cutoffs, vocab]))
    assert probe.max_numel == n * largest_cluster  # [n, 160000] tail logits; never [n, 267735]
    assert probe.max_numel < n * vocab


@pytest.mark.parametrize("div_val,d_embed,d_proj", [(4, 64, 12), (1, 8, 6)])
def test_tie_adaptive_shares_parameters(div_val, d_embed, d_proj):
    emb = AdaptiveEmbedding(V, d_embed, d_proj, CUTOFFS, div_val)
    crit = ProjectedAdaptiveLogSoftmax(V, d_embed, d_proj, CUTOFFS, div_val)
    flags = [False, True, True, True]
    tie_adaptive(emb, crit, tie_weight=True, tie_projs=flags)
    for out_layer, emb_layer in zip(crit.out_layers, emb.emb_layers):
        assert out_layer.weight is emb_layer.weight
    if div_val > 1:
        assert crit.out_projs[0] is not emb.emb_projs[0]
        assert all(crit.out_projs[i] is emb.emb_projs[i] for i in (1, 2, 3))
    else:  # one embedding projection, one output projection per cluster
        assert len(crit.out_projs) == 4 and len(emb.emb_projs) == 1
        assert crit.out_projs[0] is not emb.emb_projs[0]
        assert all(crit.out_projs[i] is emb.emb_projs[0] for i in (1, 2, 3))
    ids = torch.randint(0, V, (10,))
    crit(emb(ids), ids).sum().backward()
    assert emb.emb_layers[-1].weight.grad is not None


def test_tie_adaptive_without_projection_and_errors():
    emb = AdaptiveEmbedding(V, 8, 8, CUTOFFS, div_val=1)
    crit = ProjectedAdaptiveLogSoftmax(V, 8, 8, CUTOFFS, div_val=1)
    tie_adaptive(emb, crit, tie_weight=False, tie_projs=[False, True, True, True])  # no projection
    assert crit.out_layers[0].weight is not emb.emb_layers[0].weight and len(crit.out_projs) == 0
    with pytest.raises(TxlError, match="one flag per cluster"):
        tie_adaptive(emb, crit, tie_weight=True, tie_projs=[True])
    emb1 = AdaptiveEmbedding(V, 8, 6, CUTOFFS, div_val=1)
    with pytest.raises(TxlError, match="different"):
        tie_adaptive(emb1, crit, tie_weight=True, tie_projs=[True] * 4)


@pytest.mark.parametrize("cutoffs,div_val", [
    ([0], 1), ([V], 1), ([V + 5], 1), ([10, 5], 1), ([5, 5], 1), ([-1], 1), ([2.5], 1),
    ([5], 0), ([5], -2), ([5, 10, 20], 16),  # the last with d_embed=64: dimension 64 // 16**3 == 0
])
@pytest.mark.parametrize("cls", [AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax])
def test_invalid_configuration_raises(cls, cutoffs, div_val):
    with pytest.raises(TxlError) as info:
        cls(V, 64, 64, cutoffs, div_val)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_invalid_calls_raise():
    crit = make_crit(8, 6, CUTOFFS, 1)
    hidden = torch.randn(4, 6)
    for bad in (torch.tensor([0, 1, 2, V]), torch.tensor([0, 1, -1, 2])):
        with pytest.raises(TxlError, match="labels must lie"):
            crit(hidden, bad)
    with pytest.raises(TxlError, match="labels must have shape"):
        crit(hidden, torch.tensor([0, 1, 2]))
    with pytest.raises(TxlError, match="hidden must have shape"):
        crit.log_prob(torch.randn(4, 8))
