"""The rank monitor in three loops (train/monitor/core.py): a plain PyTorch loop, a
LightningModule that is not rankzoo's, and Hugging Face's Trainer; each writes a
ranks.jsonl that `rankzoo report` reads as a run, and resumes without repeating a step."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tests.budgets.probe.test_own import GPT, V
from train.cli import main
from train.monitor import Monitor

B, T = 2, 32


def _batch(seed: int) -> torch.Tensor:
    return torch.randint(V, (4, T), generator=torch.Generator().manual_seed(seed))


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


class Sink:
    """What a SummaryWriter is to the monitor: scalars and histograms by tag."""

    def __init__(self):
        self.scalars, self.histograms = {}, set()

    def add_scalar(self, tag, value, global_step):
        self.scalars.setdefault(tag, []).append((global_step, value))

    def add_histogram(self, tag, values, global_step):
        self.histograms.add(tag)


def _plain_loop(model, monitor: Monitor, steps: range, sink=None) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in steps:
        x = _batch(step)
        loss = F.cross_entropy(model(x)[0][:, :-1].flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        monitor.step(model, step, sinks=[sink] if sink else ())


def test_a_plain_loop_writes_a_run_rankzoo_report_reads(tmp_path, capsys):
    torch.manual_seed(0)
    model, sink = GPT().train(), Sink()
    monitor = Monitor(_batch(99)[:B], tmp_path / "gpt", every_n_steps=2, max_steps=4)
    _plain_loop(model, monitor, range(1, 6), sink)
    monitor.finish(model, 5)
    records = [json.loads(line) for line in (tmp_path / "gpt" / "ranks.jsonl").open()]
    assert ["spectra" in r["layers"][0] for r in records] == [False, True, True]
    assert model.training  # put back as it was
    assert _steps(tmp_path / "gpt" / "ranks.jsonl") == [2, 4, 5]
    assert [s for s, _ in sink.scalars["rank/L1/past_future/rank_eps/mean"]] == [2, 4]
    assert "spectrum/L0/qk" in sink.histograms and monitor.seconds > 0
    assert main(["report", str(tmp_path / "gpt"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [ly["layer"] for ly in report["variants"][0]["layers"]] == [0, 1, 2]
    # no config.yaml in a loop of the user's own: the run is named by its directory
    assert report["experiment"] == "gpt" and report["variants"][0]["variant"] == "gpt"


def test_a_resumed_loop_continues_the_file_without_repeating_a_step(tmp_path):
    torch.manual_seed(0)
    model = GPT()
    _plain_loop(model, Monitor(_batch(99)[:B], tmp_path, every_n_steps=2), range(1, 5))
    with (tmp_path / "ranks.jsonl").open("a") as f:
        f.write('{"step": 6, "lay')  # a write cut short by a crash
    with pytest.warns(UserWarning, match="incomplete last line"):
        _plain_loop(model, Monitor(_batch(99)[:B], tmp_path, every_n_steps=2), range(3, 9))
    assert _steps(tmp_path / "ranks.jsonl") == [2, 4, 6, 8]


def test_bad_settings_name_the_value(tmp_path):
    with pytest.raises(ValueError, match="every_n_steps=0"):
        Monitor(_batch(0), tmp_path, every_n_steps=0)
    with pytest.raises(ValueError, match=r"tokens \[B, T\]"):
        Monitor(torch.zeros(3), tmp_path)


def test_any_lightning_module(tmp_path):
    L = pytest.importorskip("lightning")
    from train.harness.callbacks import MonitorCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.gpt = GPT()

        def training_step(self, batch, _):
            (x,) = batch
            return F.cross_entropy(self.gpt(x)[0][:, :-1].flatten(0, 1), x[:, 1:].flatten())

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(_batch(1)), batch_size=2)
    monitor = Monitor(_batch(99)[:B], tmp_path, every_n_steps=2, forward=lambda m, x: m.gpt(x))
    trainer = L.Trainer(max_steps=4, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[MonitorCallback(monitor)], accelerator="cpu")
    trainer.fit(Module(), data)
    lines = [json.loads(line) for line in (tmp_path / "ranks.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [2, 4]
    assert "spectra" in lines[-1]["layers"][0]  # the last step keeps its spectra


def test_hugging_face_trainer(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the Trainer needs it")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")
    from tests.hf_tiny import tiny_model
    from train.hf.trainer import trainer_callback

    model = tiny_model("llama").train()
    rows = [{"input_ids": x, "labels": x} for x in _batch(3)]
    monitor = Monitor(_batch(99)[:B], tmp_path / "llama", every_n_steps=2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
        disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=rows,
                         callbacks=[trainer_callback(monitor)]).train()
    assert _steps(tmp_path / "llama" / "ranks.jsonl") == [2, 4]
