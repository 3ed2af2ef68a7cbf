"""The README's main job, end to end (slow: about 4 minutes on 2 CPU cores; run with
`python -m pytest -m slow tests/train/experiment/test_main_job.py`). Its figures are a demonstration
and are not asserted; what it must print is."""

import json

import pytest

from train.cli import main


@pytest.mark.slow
def test_the_main_job_ends_with_recall_against_capacity(tmp_path, capsys):
    assert main(["train", "configs/quick.yaml", "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "recall vs capacity" in out and "key-value pairs" in out
    assert main(["report", str(tmp_path / "quick"), "--format", "json"]) == 0
    view = json.loads(capsys.readouterr().out)["recall"]
    assert view["counts"] == [2, 4, 8]
    assert {r["variant"] for r in view["rows"]} == {"mha", "gqa", "mqa", "window", "mla", "moe",
                                                    "linear", "ssm", "local_global", "ssm_attn",
                                                    "gdn", "gdn_attn", "dsa"}
    assert all(r["carried"] is not None and r["cache_bytes"] for r in view["rows"])
