"""The documented measurement of docs/finetuning.md, end to end at toy size (slow: about 2 minutes)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_docstring_summaries_script_end_to_end(tmp_path):
    pytest.importorskip("rouge_score")
    tiny = "model.n_layer=2 model.d_model=32 model.n_head=2 model.d_head=16 model.d_inner=64"
    out = subprocess.run(
        [sys.executable, "-m", "txl_studies.summaries.run", "--work", str(tmp_path / "w"),
         "--lm-args", f"-q train.max_steps=20 train.eval_interval=20 train.sample_tokens=0 eval.max_tokens=2000 {tiny}",
         "--ft-args", "-q train.max_steps=4 train.batch_size=2 train.eval_interval=4 finetune.max_prompt_tokens=256",
         "--max-new-tokens", "8", "--seeds", "2", "--json", str(tmp_path / "summaries.json")],
        capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
                                             "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "summaries.json").read_text())
    split = json.loads((tmp_path / "w" / "data" / "split.json").read_text())
    assert set(result["systems"]) == {"a", "b0", "c0", "b1", "c1"}
    assert result["test_documents"] == split["pairs"]["test"]
    assert split["pairs"]["train_with_short"] > split["pairs"]["train"]  # what the fine-tuning read
    systems = result["systems"]
    for seed in (0, 1):  # the paired differences are of the same documents' scores: means subtract exactly
        c, b, a = systems[f"c{seed}"], systems[f"b{seed}"], systems["a"]
        assert abs(c["minus_b"]["estimate"] - (c["rougeL"] - b["rougeL"])) < 1e-9
        assert abs(c["minus_a"]["estimate"] - (c["rougeL"] - a["rougeL"])) < 1e-9
    rows = [json.loads(line) for line in (tmp_path / "w" / "summaries-c-seed0.jsonl").read_text().splitlines()]
    assert systems["c0"]["ended"] == sum(r["ended"] for r in rows) / len(rows)
    assert sum(r["documents"] for r in result["by_document_tokens"]) == result["test_documents"]
    assert result["finetune_best_step"] == [4, 4] and result["pairs"] == split["pairs"]
    pretrain = {p.name for p in (tmp_path / "w" / "data" / "pretrain").iterdir()}
    assert not pretrain & set(split["modules"]["test"] + split["modules"]["valid"])  # the answers were not seen
