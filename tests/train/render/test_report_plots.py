"""`rankzoo report` on hand-made run directories: --plot figures, bad input, no writes."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch import nn

import zoo
from budgets import probe_model
from train.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def record(model, x, step, spectra: bool) -> dict:
    probe = probe_model(model, x, with_spectra=spectra)
    for layer in probe["layers"]:  # tensors -> lists, as a monitor recording spectra would
        if "spectra" in layer:
            layer["spectra"] = {q: s.tolist() for q, s in layer["spectra"].items()}
    return {"step": step, **probe}


def write_variant(vdir, name, spectra: bool, kv_heads: int) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(zoo.build("softmax", d_model=16, n_heads=2, n_kv_heads=kv_heads)
                            for _ in range(2)))
    x = torch.randn(2, 8, 16)
    vdir.mkdir(parents=True)
    lines = [json.dumps(record(model, x, step, spectra)) for step in (5, 10)]
    (vdir / "ranks.jsonl").write_text("\n".join(lines) + "\n")
    (vdir / "config.yaml").write_text(yaml.safe_dump(
        {"variant": name, "experiment": "hand", "params": 123}))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    exp = tmp_path_factory.mktemp("runs") / "hand"
    write_variant(exp / "mha", "mha", spectra=True, kv_heads=2)
    write_variant(exp / "mqa", "mqa", spectra=False, kv_heads=1)
    return exp


def snapshot(root):
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_plot_writes_pngs_and_never_touches_the_run(run, tmp_path, capsys):
    before = snapshot(run)
    out = tmp_path / "figs"
    assert main(["report", str(run), "--plot", str(out), "--format", "json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout is still exactly one JSON document
    assert [v["variant"] for v in doc["variants"]] == ["mha", "mqa"] and "advice" in doc
    names = sorted(p.name for p in out.iterdir())
    assert names == ["declared_vs_realized.png", "heads_mha.png", "heads_mqa.png",
                     "rank_over_training.png", "spectrum_mha.png"]
    for p in out.iterdir():
        data = p.read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, p
    assert "mqa: no spectra" in captured.err and "wrote 5 figures" in captured.err
    assert snapshot(run) == before


def test_table_shows_verdicts_and_advice(run, capsys):
    assert main(["report", str(run / "mqa"), "--details"]) == 0
    out = capsys.readouterr().out
    assert "advice" in out and "verdict" in out and "low-rank cache" in out


def test_the_terminal_report_opens_with_a_short_answer(run, capsys):
    assert main(["report", str(run)]) == 0
    short = capsys.readouterr().out
    assert main(["report", str(run), "--details"]) == 0
    details = capsys.readouterr().out
    assert short.startswith("summary: ") and details.startswith("rank budget: ")
    assert f"`rankzoo report {run} --details`" in short and "verdict" not in short
    assert len(short.splitlines()) <= 40 < len(details.splitlines())
    for variant in ("mha", "mqa"):  # one row each: status, key metric, the budget's parts
        (row,) = [ln for ln in short.splitlines() if ln.split()[:1] == [variant]]
        assert "pretrain" in row and "inference" in row


def test_plot_refuses_a_non_empty_dir(run, tmp_path, capsys):
    out = tmp_path / "figs"
    out.mkdir()
    (out / "keep.png").write_bytes(b"mine")
    assert main(["report", str(run), "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--plot {out}: directory is not empty" in err and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == ["keep.png"]
    assert (out / "keep.png").read_bytes() == b"mine"


def test_corrupt_ranks_line_is_named(run, tmp_path, capsys):
    vdir = tmp_path / "mha"
    vdir.mkdir()
    lines = (run / "mha" / "ranks.jsonl").read_text().splitlines()
    ranks = vdir / "ranks.jsonl"
    ranks.write_text("\n".join([lines[0], '{"step": 7, "lay', lines[1]]) + "\n")
    assert main(["report", str(vdir)]) == 2
    assert capsys.readouterr().err.startswith(f"rankzoo: error: {ranks}:2: corrupt rank record")
    ranks.write_text(lines[0] + "\n[1, 2]\n")
    assert main(["report", str(vdir)]) == 2
    assert f"{ranks}:2: corrupt rank record (expected an object" in capsys.readouterr().err
    ranks.write_text("\n\n")
    assert main(["report", str(vdir)]) == 2
    assert f"{ranks} holds no rank records" in capsys.readouterr().err


def test_run_dir_without_results(tmp_path, capsys):
    vdir = tmp_path / "v"
    vdir.mkdir()
    (vdir / "config.yaml").write_text("variant: v\n")
    before = snapshot(tmp_path)
    assert main(["report", str(vdir), "--plot", str(tmp_path / "figs")]) == 2
    assert f"no results in {vdir}: neither report.json nor ranks.jsonl" in capsys.readouterr().err
    assert snapshot(tmp_path) == before and not (tmp_path / "figs").exists()
