"""The long-range retrieval suite (issue 24, part 1): data builders with exact distances and no leakage, the
scoring of answers, and a toy end-to-end run of ``txl bench --long-range``."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from conftest import one_error_line, run_cli
from txl.config import IGNORE_INDEX, AttentionSpan
from txl_studies.long_range.episodes import (CLOSE, FACT, HANDLES, PASS_KEY_HANDLE, TASKS, VALUE_BYTES, VALUES, episode,
                                 episode_batch, is_test_value, load_filler, training_stream)
from txl_studies.long_range.scoring import retrieval_score
from txl.model import LMOutput

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def filler():
    return load_filler(seed=0)


def test_the_filler_is_ascii_holds_no_part_of_a_fact_and_its_splits_are_disjoint(filler):
    for name in ("train", "valid", "test"):
        part = filler.split(name)
        assert part.max() < 0x80 and not np.isin(part, (FACT, CLOSE)).any() and len(part) > 100_000
    # split by file: each file in one split, each split's filler its files' bytes (non-ASCII as "?")
    files = filler.files
    assert not set(files["train"]) & set(files["test"]) and not set(files["valid"]) & set(files["test"])
    assert len(files["train"]) > 5 * len(files["test"]) > 0
    from pathlib import Path

    test = b"".join(Path(f).read_bytes() for f in files["test"])
    assert bytes(b if b < 0x80 else ord("?") for b in test) == filler.test.tobytes()


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("distance", [8, 16, 63, 64, 65, 300, 1024])
def test_an_episode_asks_at_exactly_its_distance_with_the_fact_stated_once(filler, task, distance):
    rng = np.random.default_rng(distance)
    e = episode(rng, filler.test, distance, task, tail=17)
    t = e.tokens
    assert e.distance == distance and t[e.answer:e.answer + VALUE_BYTES].tolist() == e.value.tolist()
    handle = int(t[e.answer - 1])
    assert t[e.answer - 2] == FACT and handle in HANDLES
    # the fact: its value starts exactly `distance` tokens before the answer, right after FACT handle
    v = e.answer - distance
    assert t[v - 2] == FACT and t[v - 1] == handle and t[v:v + VALUE_BYTES].tolist() == e.value.tolist()
    # the handle is bound once before the question; every value byte occurs only in facts and the answer
    assert [i for i in np.flatnonzero(t == handle) if i < e.answer - 1] == [v - 1]
    assert np.isin(t[np.isin(t, list(VALUES))], list(VALUES)).all() and is_test_value(e.value)
    others = [i for i in np.flatnonzero(np.isin(t, list(HANDLES))) if i not in (v - 1, e.answer - 1)]
    if task == "pass-key":
        assert handle == PASS_KEY_HANDLE and others == []
    elif distance >= 40:  # room for the distractor bindings between the fact and the question
        assert len(others) == 3 and len({int(t[i]) for i in others}) == 3 and handle not in {int(t[i]) for i in others}
        assert all(v < i < e.answer for i in others)


@pytest.mark.parametrize("law", ["uniform", "log"])
def test_a_training_stream_asks_each_fact_once_with_no_other_binding_of_its_handle_within_reach(filler, law):
    rng = np.random.default_rng(1)
    tokens, labels = training_stream(rng, filler.train, 30_000, (8, 200), law=law)
    answers = np.flatnonzero(labels != IGNORE_INDEX)
    assert len(tokens) == 30_000 and len(answers) > 30_000 * 0.01 and (labels[answers] == tokens[answers]).all()
    starts = [a for a in answers if labels[a - 1] == IGNORE_INDEX]
    distances = []
    for a in starts:
        handle, value = int(tokens[a - 1]), tokens[a:a + VALUE_BYTES].tolist()
        assert tokens[a - 2] == FACT and handle in HANDLES and not is_test_value(np.array(value))
        # within twice the longest distance before the question, the handle occurs once: in its own fact
        seen = [i for i in range(max(0, a - 2 - 400), a - 1) if tokens[i] == handle]
        assert len(seen) == 1 and tokens[seen[0] - 1] == FACT
        assert tokens[seen[0] + 1:seen[0] + 1 + VALUE_BYTES].tolist() == value
        distances.append(a - (seen[0] + 1))
    assert 8 <= min(distances) and max(distances) <= 200
    assert np.isin(tokens, list(VALUES)).sum() >= len(starts) * 2 * VALUE_BYTES  # facts, answers (and distractors)


def test_episode_batches_left_pad_and_label_only_the_answers(filler):
    rng = np.random.default_rng(2)
    eps = [episode(rng, filler.test, 40, "associative", tail=t) for t in (0, 9, 30)]
    tokens, labels = episode_batch(eps)
    assert tokens.shape == labels.shape == (3, max(len(e.tokens) for e in eps))
    for b, e in enumerate(eps):
        shift = tokens.shape[1] - len(e.tokens)
        assert (tokens[b, :shift] == ord(" ")).all() and tokens[b, shift:].tolist() == e.tokens.tolist()
        assert np.flatnonzero(labels[b] != IGNORE_INDEX).tolist() == [shift + e.answer, shift + e.answer + 1]


class _Oracle(nn.Module):
    """A stand-in model: predicts the next token of a known table for rows in ``right``, else token 0."""

    def __init__(self, table: torch.Tensor, right: set[int]):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.table, self.right = table, right
        self.config = type("C", (), {"attn_type": "rel", "n_layer": 1, "vocab_size": 256})()
        self.calls = 0

    def forward(self, x, mems=None, labels=None, caches=None, span=None, **kw):
        start = 0 if mems is None else int(mems[0][0, 0])
        logits = torch.zeros(*x.shape, 256)
        for b in range(x.size(0)):
            for j in range(x.size(1)):
                nxt = self.table[b, start + j + 1] if b in self.right else 0
                logits[b, j, nxt] = 1.0
        new = [torch.full((x.size(0), 1, 1), float(start + x.size(1)))]
        return LMOutput(logits=logits, loss=None, mems=new)


def test_retrieval_score_counts_exact_answers_and_bytes_by_hand():
    tokens = torch.randint(1, 100, (4, 40), generator=torch.Generator().manual_seed(0))
    labels = torch.full((4, 40), IGNORE_INDEX)
    labels[:, 30:32] = tokens[:, 30:32]
    tokens[3, 31] = 0  # row 3's second answer byte is the token the wrong model predicts: 1 of 2 right
    labels[3, 31] = 0
    model = _Oracle(tokens, right={0, 2})
    score = retrieval_score(model, tokens.numpy(), labels.numpy(), span=AttentionSpan(16, 16), batch_size=4)
    assert score.exact.tolist() == [True, False, True, False] and score.accuracy == 0.5
    assert (score.bytes_right, score.bytes_total) == (5, 8) and score.byte_accuracy == 5 / 8


def test_the_suite_runs_end_to_end_on_a_toy_budget(tmp_path):
    from txl_studies.long_range.suite import ROWS, Budget, run_long_range

    rows = tuple(r for r in ROWS if r.name in ("mem64", "abs", "mem64-bptt4"))
    budget = Budget(steps=8, batch_size=4, n_layer=1, d_model=32, n_head=2, d_inner=64, episodes=3)
    results = run_long_range(tmp_path / "lr", rows=rows, seeds=(0,), budget=budget, distances=(16, 64),
                             log=lambda m: None, plot=True)
    by_name = {r["name"]: r for r in results["rows"]}
    assert [r["name"] for r in results["rows"]] == ["mem64", "abs", "mem64-bptt4"]
    assert by_name["mem64"]["reach"] == 128 and by_name["mem64"]["distances"] == [16, 64, 128, 256]
    assert by_name["abs"]["reach"] == 320 and by_name["abs"]["distances"] == [16, 64, 320, 640]
    assert by_name["mem64-bptt4"]["train_distances"] == [8, 64 + 4 * 64]  # what 4 segments and the memory cover
    assert by_name["abs"]["train_distances"] == [8, 320] and by_name["mem64"]["train_distances"] == [8, 128]
    assert all(r["seeds"][0]["steps"] == 8 for r in results["rows"])  # the same number of episodes for every row
    for r in results["rows"]:
        for task in TASKS:
            for d in r["distances"]:
                s = r["seeds"][0]["scores"][task][str(d)]
                assert s["episodes"] == 3 and 0 <= s["accuracy"] <= s["byte_accuracy"] + 1e-9 <= 1 + 1e-9
    assert "fact_attention" in by_name["mem64"]["seeds"][0]["scores"]["pass-key"]["16"]
    assert "fact_attention" not in by_name["abs"]["seeds"][0]["scores"]["pass-key"]["16"]
    assert json.loads((tmp_path / "lr" / "results.json").read_text()) == results
    table = (tmp_path / "lr" / "long_range.md").read_text()
    assert "### pass-key" in table and "| mem64 | 128 |" in table
    assert "#### associative: attention on the fact" in table and "\n| mem64 | " in table.split("#### associative")[1]
    assert (tmp_path / "lr" / "long_range.png").stat().st_size > 1000


def test_bench_long_range_refuses_bad_flags_before_training(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    for argv, words in [(["--rows", "mem64,nope"], "--rows takes names among"),
                        (["--seeds", "0"], "--seeds must be >= 1"),
                        (["--first-seed", "-1"], "--first-seed must be >= 0"),
                        (["--pool", "0"], "--pool must be >= 1"),
                        (["--out", tmp_path / "full"], "is not an empty folder"),
                        (["--json", tmp_path / "r.json"], "--json does not apply to --long-range")]:
        code, _, err = run_cli(capsys, "bench", "--long-range", *argv)
        assert code == 2 and words in one_error_line(err), err
    code, _, err = run_cli(capsys, "bench", "--rows", "mem64")
    assert code == 2 and "--rows applies to --long-range only" in one_error_line(err)
    code, _, err = run_cli(capsys, "bench", "--first-seed", "2")
    assert code == 2 and "--first-seed applies to --long-range only" in one_error_line(err)
    code, _, err = run_cli(capsys, "bench", "--pool", "96000")
    assert code == 2 and "--pool applies to --long-range only" in one_error_line(err)


def test_bench_long_range_first_seed_runs_the_seeds_from_it(tmp_path, capsys, monkeypatch):
    """``--first-seed 2 --seeds 2`` trains seeds 2 and 3: a seed missing from a full run, run alone."""
    import txl_studies.long_range.suite as long_range

    seen = {}

    def fake(out, *, rows, seeds, budget, **kwargs):
        seen.update(rows=[r.name for r in rows], seeds=seeds, pool=budget.pool, steps=budget.steps)
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / long_range.TABLE_NAME).write_text("table", encoding="utf-8")

    monkeypatch.setattr(long_range, "run_long_range", fake)
    code, out, _ = run_cli(capsys, "bench", "--long-range", "--rows", "cmem", "--first-seed", "2", "--seeds", "2",
                           "--out", tmp_path / "lr", "-q")
    assert code == 0 and seen == {"rows": ["cmem"], "seeds": (2, 3), "pool": 16384, "steps": 1000} and "table" in out
    # --pool: the distinct training episodes the steps draw from
    assert run_cli(capsys, "bench", "--long-range", "--rows", "cmem", "--pool", "96000", "--steps", "3000",
                   "--out", tmp_path / "pool", "-q")[0] == 0
    assert (seen["pool"], seen["steps"]) == (96000, 3000)
    # the default rows are the equal-budget ones; mem64-bptt2 (3,000 steps in the docs) runs when named
    assert run_cli(capsys, "bench", "--long-range", "--out", tmp_path / "all", "-q")[0] == 0
    assert seen["rows"] == ["mem64", "mem256", "mem1024", "cmem", "mem0", "abs", "mem64-bptt4"]
    assert seen["seeds"] == (0, 1, 2)
    assert run_cli(capsys, "bench", "--long-range", "--rows", "mem64-bptt2", "--out", tmp_path / "b2", "-q")[0] == 0
    assert seen["rows"] == ["mem64-bptt2"]
    # the command line names the rows without importing torch: its list must be the suite's
    code, _, err = run_cli(capsys, "bench", "--long-range", "--rows", "nope", "--out", tmp_path / "n")
    listed = one_error_line(err).split("names among ")[1].split(", got")[0].split(", ")
    assert code == 2 and listed == [r.name for r in long_range.ROWS + long_range.EXTRA_ROWS]


def test_fact_attention_equals_the_mass_one_long_pass_puts_on_the_value_bytes(filler):
    """Read in segments with a memory that holds everything = one long causal pass (paper §3.2), so the
    attention the answer's query puts on the fact's value bytes must equal that of one pass, by hand."""
    from txl.analysis.attention_maps import segment_probabilities
    from txl_studies.long_range.suite import fact_attention
    from txl.model import TransformerXLConfig, TransformerXLLM

    torch.manual_seed(0)
    model = TransformerXLLM(TransformerXLConfig(vocab_size=256, n_layer=2, d_model=32, n_head=2, d_head=16,
                                                d_inner=64, tgt_len=16, mem_len=256, dropout=0.0)).double().eval()
    rng = np.random.default_rng(3)
    eps = [episode(rng, filler.test, d, "associative", tail=5) for d in (20, 37, 50)]
    got = fact_attention(model, eps, AttentionSpan(16, 256))
    tokens, _ = episode_batch(eps)
    probs = segment_probabilities(model, torch.as_tensor(tokens), span=AttentionSpan(tokens.shape[1], 0))
    want = np.zeros((len(eps), 2))
    for b, e in enumerate(eps):
        shift = tokens.shape[1] - len(e.tokens)
        value = shift + e.answer - e.distance
        assert list(tokens[b, value:value + VALUE_BYTES]) == list(e.value)
        for layer, p in enumerate(probs):
            want[b, layer] = float(p[b, :, shift + e.answer - 1, value:value + VALUE_BYTES].sum(-1).max())
    assert got == pytest.approx(want.mean(0).tolist(), abs=1e-4)  # rounded to 4 places
    assert min(got) > 0
    # a memory too short to hold the fact: the query's keys do not reach it, so no attention lands there
    assert fact_attention(model, eps, AttentionSpan(16, 0)) == [0.0, 0.0]


def test_fact_shares_with_a_full_memory_equal_layer_0_of_one_pass_renormalised_over_the_keys_in_view(filler):
    """With mem_len 32 the memory fills and is trimmed, so key 0 of a segment is column start - 32. Layer 0
    reads embeddings (its memory too), so its probabilities in a segment are one pass's, renormalised over
    the columns in view [start - 32, query]: checked per episode, unrounded, in float64."""
    from txl.analysis.attention_maps import segment_probabilities
    from txl_studies.long_range.suite import fact_shares
    from txl.model import TransformerXLConfig, TransformerXLLM

    torch.manual_seed(1)
    model = TransformerXLLM(TransformerXLConfig(vocab_size=256, n_layer=2, d_model=32, n_head=2, d_head=16,
                                                d_inner=64, tgt_len=16, mem_len=32, dropout=0.0)).double().eval()
    with torch.no_grad():  # sharper attention than at initialisation, so that a wrong column shows
        model.layers[0].attn.qkv_net.weight.mul_(4.0)
    rng = np.random.default_rng(5)
    eps = [episode(rng, filler.test, d, task, tail=int(rng.integers(0, 16)))
           for d, task in ((9, "pass-key"), (20, "associative"), (33, "pass-key"), (40, "associative"), (47, "pass-key"))]
    width = max(len(e.tokens) for e in eps) + 7  # as if scored in a wider batch
    got = fact_shares(model, eps, AttentionSpan(16, 32), width=width)
    tokens, _ = episode_batch(eps, width=width)
    assert tokens.shape[1] == width and (tokens[:, :7] == ord(" ")).all()
    p0, _ = segment_probabilities(model, torch.as_tensor(tokens), span=AttentionSpan(width, 0))
    seen = 0
    for b, e in enumerate(eps):
        shift = width - len(e.tokens)
        query = shift + e.answer - 1
        lo = max(0, query // 16 * 16 - 32)  # the first column in view: the segment's start minus the memory
        value = shift + e.answer - e.distance
        on_value = [c for c in (value, value + 1) if c >= lo]
        row = p0[b, :, query]  # [H, width]
        want = (row[:, on_value].sum(-1) / row[:, lo:query + 1].sum(-1)).max().item() if on_value else 0.0
        assert got[b, 0] == pytest.approx(want, rel=1e-9, abs=1e-12), (b, e.distance)
        seen += bool(on_value)
    assert 0 < seen < len(eps)  # some facts in view, some beyond it


def test_merge_adds_seeds_and_rows_and_refuses_conflicts():
    from txl_studies.long_range import merge as script

    merge = script.merge
    seed = lambda s: {"seed": s, "scores": {"pass-key": {"16": {"accuracy": s / 4}}}}  # noqa: E731
    row = lambda name, seeds, reach=128: {"name": name, "reach": reach, "distances": [16], "seeds": seeds}  # noqa: E731
    base = {"budget": {"steps": 1000}, "command": "c", "rows": [row("mem64", [seed(0), seed(1)])]}
    part = {"budget": {"steps": 1000}, "rows": [row("mem64", [seed(2)]), row("abs", [seed(0)], reach=320)]}
    merged = merge(base, [("part", part)])
    assert merged["seeds_per_row"] == {"mem64": [0, 1, 2], "abs": [0]} and merged["command"] == "c"
    assert merged["seeds"] == [0, 1, 2] and part["rows"][1]["seeds"] == [seed(0)]
    assert [s["scores"]["pass-key"]["16"]["accuracy"] for s in merged["rows"][0]["seeds"]] == [0, 0.25, 0.5]
    assert base["rows"][0]["seeds"] == [seed(0), seed(1)]  # the base is not changed
    for bad, words in [({"budget": {"steps": 1000}, "rows": [row("mem64", [seed(1)])]}, "seed 1 is already"),
                       ({"budget": {"steps": 3000}, "rows": [row("mem64", [seed(2)])]}, "budget"),
                       ({"budget": {"steps": 1000}, "rows": [row("mem64", [seed(2)], reach=64)]}, "other settings")]:
        with pytest.raises(script.Refused, match=words):
            merge(base, [("bad", bad)])


def test_reachable_share_counts_both_answer_queries_by_hand():
    """tgt_len 4, mem_len 2: an answer's queries at columns 7 and 8 (segment indices 3 and 0) see back to
    columns 2 and 6 in one layer (their segment's start minus 2); in two layers to the earliest column the
    states in view see: 0 - 2 = -2 (from column 2) and 4 - 2 = 2 (from column 6), i.e. 9 and 6 tokens
    back. A value 5 back (query to key: 4) is out of the second query's direct view but within two layers'."""
    from types import SimpleNamespace

    from txl_studies.long_range.suite import reachable_share

    def ep(n, answer, distance):
        return SimpleNamespace(tokens=list(range(n)), answer=answer, distance=distance)

    far, near = ep(10, 8, 5), ep(6, 4, 3)  # near, padded to 10: queries at 7, 8 again, 2 back: in view
    assert reachable_share([far], 4, 2, 1) == 0.0 and reachable_share([far], 4, 2, 2) == 1.0
    assert reachable_share([far, near], 4, 2, 1) == 0.5
    assert reachable_share([ep(10, 8, 7)], 4, 2, 2) == 1.0  # 6 back from column 8: exactly the two-layer reach
    assert reachable_share([ep(10, 8, 8)], 4, 2, 2) == 0.0  # 7 back: beyond it for the second query
    assert reachable_share([ep(10, 8, 8)], 4, 2, 3) == 1.0  # three layers: 8 -> 2 -> -2 -> -6
    # mem_len a multiple of tgt_len (the suite's rows): layers x mem_len + the query's index in its segment
    assert reachable_share([ep(200, 150, 129)], 64, 64, 2) == 1.0  # queries at 149, 150 (index 21, 22): 128 back
    assert reachable_share([ep(200, 150, 151)], 64, 64, 2) == 0.0  # 150 back > 128 + 21


def test_a_row_of_its_own_depth_trains_and_reaches_with_it(tmp_path):
    """mem64-L4-bptt4 has 4 layers whatever the budget says: its model, its stacked reach, its ceiling."""
    from txl_studies.long_range.suite import EXTRA_ROWS, ROWS, Budget, row_run

    deep = next(r for r in EXTRA_ROWS if r.name == "mem64-L4-bptt4")
    budget = Budget()
    assert row_run(deep, budget, 0, tmp_path / "a").model.n_layer == 4
    assert row_run(ROWS[0], budget, 0, tmp_path / "b").model.n_layer == budget.n_layer == 2
    assert deep.stacked_reach(budget.tgt_len, deep.layers(budget)) == 4 * 64 + 64
    assert deep.train_distances(budget.tgt_len, budget.max_train_distance) == (8, 64 + 4 * 64)
