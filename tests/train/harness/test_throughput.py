"""What a run reports of its speed (tokens per second), and the train scalars it logs only
at the steps that read them, each the loss a plain loop computes at that step."""

import contextlib
import io
import json
import re

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from benches.train.harness.bench_loop import plain_loop
from tests.train.conftest import tiny_experiment
from train.cli import main
from train.config import parse_experiment

# train/* logged every 2 steps; validation and checkpoints at 3: steps 2, 3, 4, 6 read them
RAW = tiny_experiment(name="speed", train={"max_steps": 6, "log_every_n_steps": 2})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny run through `rankzoo train` (JSON on stdout, the log on stderr)."""
    root = tmp_path_factory.mktemp("speed")
    config = root / "exp.yaml"
    config.write_text(json.dumps(RAW))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", str(config), "--runs-dir", str(root / "runs"), "--format", "json"])
    assert code == 0, err.getvalue()
    return root / "runs" / "speed", json.loads(out.getvalue()), err.getvalue()


def test_a_run_reports_its_tokens_per_second_in_its_metrics_and_log(trained):
    run, report, log = trained
    (variant,) = report["variants"]
    m = variant["metrics"]
    tokens = 6 * RAW["data"]["batch_size"] * RAW["data"]["seq_len"]  # steps x [B, T]
    assert m["tokens_per_second"] == pytest.approx(tokens / m["fit_seconds"], rel=1e-9)
    on_disk = json.loads((run / "mha" / "report.json").read_text())["variants"][0]["metrics"]
    assert on_disk["tokens_per_second"] == m["tokens_per_second"]
    closing = re.search(r"mha: step 6, .*\(\d+ s, ([\d,]+) tokens/s\)", log)
    assert closing and int(closing.group(1).replace(",", "")) == round(m["tokens_per_second"])
    # each validation line: the throughput since the line before
    assert len(re.findall(r"step [36]: train/loss .* · [\d,]+ tokens/s", log)) == 2


def test_the_closing_summary_states_tokens_per_second_beside_the_key_metric(trained,
                                                                              capsys):
    run, report, _ = trained
    assert main(["report", str(run)]) == 0
    summary = capsys.readouterr().out
    header = next(line for line in summary.splitlines() if "key metric" in line)
    assert header.index("key metric") < header.index("tokens/s") < header.index("budget")
    rate = f"{report['variants'][0]['metrics']['tokens_per_second']:,.0f}"
    row = next(line for line in summary.splitlines() if line.split()[:1] == ["mha"])
    assert rate in row
    assert main(["report", str(run), "--details"]) == 0  # the variants table has it too
    assert rate in capsys.readouterr().out


def test_train_scalars_are_the_loss_of_their_step_where_anything_reads_them(trained):
    run, _, log = trained
    losses = plain_loop(parse_experiment(RAW), "mha")["losses"]  # losses[k]: step k + 1's
    events = EventAccumulator(str(run / "mha"), size_guidance={"scalars": 0})
    events.Reload()
    shown = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in shown] == [2, 4, 6]  # log_every_n_steps, at the console's steps
    assert [v for _, v in shown] == pytest.approx([losses[s - 1] for s, _ in shown], rel=1e-6)
    # step 3 validates: its line shows step 3's loss, not step 2's (the last logged before)
    shown_at_3 = re.search(r"step 3: train/loss (\S+)", log).group(1)
    assert shown_at_3 == f"{losses[2]:.4g}" != f"{losses[1]:.4g}"
