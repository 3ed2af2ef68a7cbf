"""The rank monitor: realized rank per layer, measured every n steps on a fixed probe
batch, of any model in any training loop.

    monitor = Monitor(probe_batch, "runs/mine/gpt", every_n_steps=100)
    for step in range(1, steps + 1):
        ...                                  # the loop's own step
        monitor.step(model, step)            # measures when due; otherwise returns at once
    monitor.finish(model, step)              # the last step, with its spectra (once)

Each measurement appends one line to `<dir>/ranks.jsonl` (the run directory's format, so
`rankzoo report <dir>` reads it as a run) and logs scalars `rank/L<i>/<quantity>/<metric>`
(per head and the mean) and spectrum histograms to the sinks it is given: Lightning's
loggers, or a TensorBoard SummaryWriter (`tensorboard=True` makes one in `<dir>`). A zoo
model is probed through its blocks (budgets.probe_model); any other model through its SDPA
calls (budgets.probe_torch_model), called by `forward(model, tokens)`. The model is probed
in eval mode without gradients and put back as it was; resuming into an existing
ranks.jsonl keeps its steps and measures only later ones.

Thin adapters: the plain loop calls `step`; a Lightning callback
(train/harness/callbacks.py) and a Hugging Face Trainer callback (train/hf/trainer.py) call
it from their hooks. Nothing here imports Lightning or transformers.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

import torch
from torch import nn

import budgets
from budgets.advice.rows import row_key

from ..rundir.files import append_line, write_text
from ..rundir.layout import RANKS_FILE

# (quantity, metric) pairs logged as scalars: a few, so TensorBoard stays readable.
DEFAULT_SCALARS = (
    ("mixing_centered", "erank"),
    ("mixing", "erank"),
    ("past_future", "rank_eps"),
    ("qk", "rank_eps"),
    ("value", "rank_eps"),
    ("inference.k", "erank"),
)
DEFAULT_HISTOGRAMS = ("mixing_centered", "qk", "value", "inference.k", "inference.v")


def read_steps(path: Path) -> list[int]:
    """Steps recorded in a ranks.jsonl file (empty when it does not exist)."""
    if not path.exists():
        return []
    steps = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not a ranks record ({e})") from None
    return steps


def repair_tail(path: Path) -> None:
    """Drop a last line cut short by a crash mid-write (it has no newline and no JSON)."""
    if not path.exists():
        return
    text = path.read_text()
    if not text or text.endswith("\n"):
        return
    head, _, tail = text.rpartition("\n")
    try:
        json.loads(tail)
        write_text(path, text + "\n")
    except ValueError:
        warnings.warn(f"{path}: dropping an incomplete last line left by an interrupted run",
                      stacklevel=2)
        write_text(path, head + "\n" if head else "")


def report_progress(step: int, p: budgets.ProbeProgress) -> None:
    """A measurement's progress on stderr, once it has taken more than a second (the
    quick ones stay silent): `rankzoo: ranks at step 400: layer 3/8 · 2.1 s · ETA 3 s`."""
    if p.elapsed > 1.0:
        print(f"rankzoo: ranks at step {step}: layer {p.done}/{p.total} · {p.elapsed:.1f} s"
              f" · ETA {p.eta:.0f} s", file=sys.stderr, flush=True)


def spectra_lists(spectra: dict[str, torch.Tensor]) -> dict[str, list[list[float]]]:
    """Spectra as ranks.jsonl holds them: {quantity: [rows][k]} (a 1-D spectrum is one
    row), each value to 6 significant digits (a plot needs no more; half the bytes)."""
    out = {}
    for quantity, s in spectra.items():
        rows = s.detach().float().cpu().reshape(-1, s.shape[-1]).tolist() if s.numel() else []
        if rows:
            out[quantity] = [[float(f"{x:.6g}") for x in row] for row in rows]
    return out


def probe_any(model: nn.Module, batch: torch.Tensor, eps: float, with_spectra: bool,
              forward: Callable | None, progress) -> dict:
    """The probe of a zoo model through its blocks, of a Hugging Face model through its
    attention interface (report --hf's probe), else of any model through its SDPA calls
    (`forward(model, tokens)`, default `model(tokens)`)."""
    if budgets.probeable_blocks(model):
        return budgets.probe_model(model, batch, eps=eps, with_spectra=with_spectra,
                                   progress=progress)
    if callable(getattr(model, "set_attn_implementation", None)):
        from budgets.hf.probe import probe_hf_model

        return probe_hf_model(model, batch, eps, with_spectra, progress=progress)[0]
    options = {"forward": forward} if forward is not None else {}
    probe, _ = budgets.probe_torch_model(model, batch, eps, with_spectra, progress=progress,
                                         **options)
    return probe


@contextlib.contextmanager
def measuring(model: nn.Module):
    """Eval mode, no gradients and no autocast inside; the model's own modes restored."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    device = next(model.parameters()).device.type
    try:
        with torch.no_grad(), torch.autocast(device, enabled=False):
            yield
    finally:
        for m, training in modes.items():
            m.train(training)


class Monitor:
    """Realized ranks every `every_n_steps` steps on `probe_batch` [B, T], into
    `out_dir`/ranks.jsonl and the sinks; `seconds` is the time spent measuring."""

    def __init__(self, probe_batch: torch.Tensor, out_dir: str | Path | None = None,
                 every_n_steps: int = 100, eps: float = 0.1, *,
                 out_path: str | Path | None = None,
                 forward: Callable[[nn.Module, torch.Tensor], object] | None = None,
                 scalars: Iterable[tuple[str, str]] = DEFAULT_SCALARS,
                 histograms: Iterable[str] | None = DEFAULT_HISTOGRAMS,
                 tensorboard: bool = False, labels: Iterable[str] = (),
                 max_steps: int | None = None):
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r}: must be a positive integer")
        if not isinstance(probe_batch, torch.Tensor) or probe_batch.dim() != 2:
            raise ValueError(f"probe_batch must be tokens [B, T], got "
                             f"{getattr(probe_batch, 'shape', type(probe_batch).__name__)}")
        if (out_dir is None) == (out_path is None):
            raise ValueError("Monitor needs exactly one of out_dir and out_path")
        self.probe_batch, self.every_n_steps, self.eps = probe_batch, every_n_steps, eps
        self.out_path = Path(out_path) if out_path is not None else Path(out_dir) / RANKS_FILE
        self.forward, self.scalars = forward, tuple(scalars)
        self.histograms = tuple(histograms or ())
        self.labels = list(labels)  # a hybrid's label per layer
        self.max_steps = max_steps  # its step's measurement keeps the spectra
        self.sinks: list = []
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.sinks.append(SummaryWriter(str(self.out_path.parent)))
        self.seconds = 0.0
        self.last_step: int | None = None  # read from ranks.jsonl at first use

    def resume(self) -> None:
        """Continue an existing ranks.jsonl: a torn last line dropped, its steps kept.
        Done at first use (in a distributed run, by the one process that measures)."""
        repair_tail(self.out_path)
        self.last_step = max(read_steps(self.out_path), default=-1)

    def due(self, step: int) -> bool:
        if self.last_step is None:
            self.resume()
        return step % self.every_n_steps == 0 and step > self.last_step

    def step(self, model: nn.Module, step: int, sinks: Iterable = ()) -> dict | None:
        """Measure at `step` when it is due (every n steps, not yet recorded); at
        max_steps, with the spectra kept."""
        if not self.due(step):
            return None
        final = self.max_steps is not None and step >= self.max_steps
        return self.measure(model, step, final=final, sinks=sinks)

    def finish(self, model: nn.Module, step: int, sinks: Iterable = ()) -> dict | None:
        """The last measurement, whatever the step (unless `step` was measured already:
        give max_steps to keep its spectra then), with its spectra kept in ranks.jsonl
        (for the report's plots); then the monitor's own writers are flushed."""
        record = self.measure(model, step, final=True, sinks=sinks)
        for sink in self.sinks:
            getattr(sink, "flush", lambda: None)()
        return record

    def measure(self, model: nn.Module, step: int, final: bool = False,
                sinks: Iterable = ()) -> dict | None:
        """Probe, record and log at `step`; None if that step is already recorded."""
        if self.last_step is None:
            self.resume()
        if step <= self.last_step:
            return None
        began = time.perf_counter()
        batch = self.probe_batch.to(next(model.parameters()).device)
        with measuring(model):
            probe = probe_any(model, batch, self.eps, bool(self.histograms) or final,
                              self.forward, partial(report_progress, step))
        # by row: two mixers of one layer (falcon_h1's SSM and attention) are two rows
        spectra = {row_key(layer): layer.pop("spectra", {}) for layer in probe["layers"]}
        record = {"step": step, **probe}
        if final:  # the last measurement keeps them in ranks.jsonl, for the report's plots
            record["layers"] = [{**layer, "spectra": spectra_lists(spectra[row_key(layer)])}
                                for layer in probe["layers"]]
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        # one write per line, cut off again if it fails: the file holds whole lines
        append_line(self.out_path, json.dumps(record, allow_nan=True))
        self.last_step = step
        self.log([*self.sinks, *sinks], probe, spectra, step)
        self.seconds += time.perf_counter() - began
        return record

    def layer_tag(self, i: int, mixer: str = "") -> str:
        """`L3`, or for a hybrid's layer `L3.global`: TensorBoard then lists a pattern's
        kinds apart (a uniform run's tags are as they always were); one of several mixers
        in a layer adds its own: `L3.self_attn`."""
        tag = f"L{i}.{self.labels[i]}" if i < len(self.labels) else f"L{i}"
        return f"{tag}.{mixer}" if mixer else tag

    def scalars_of(self, probe: dict) -> dict[str, float]:
        """`rank/L<i>/<quantity>/<metric>/mean` and, per head, `/h<h>`."""
        metrics: dict[str, float] = {}
        for layer in probe["layers"]:
            (i, mixer), quantities = row_key(layer), layer["quantities"]
            for quantity, metric in self.scalars:
                values = quantities.get(quantity, {}).get(metric)
                if not values:
                    continue
                tag = f"rank/{self.layer_tag(i, mixer)}/{quantity}/{metric}"
                if len(values) > 1:
                    for h, v in enumerate(values):
                        metrics[f"{tag}/h{h}"] = v
                metrics[f"{tag}/mean"] = sum(values) / len(values)
        return metrics

    def log(self, sinks: list, probe: dict, spectra: dict, step: int) -> None:
        """Scalars to each sink (a Lightning logger's log_metrics, or a SummaryWriter's
        add_scalar), histograms to each that draws them."""
        metrics = self.scalars_of(probe)
        for sink in sinks:
            if hasattr(sink, "log_metrics"):
                sink.log_metrics(metrics, step=step)
            else:
                for tag, value in metrics.items():
                    sink.add_scalar(tag, value, global_step=step)
            writer = sink if hasattr(sink, "add_histogram") else getattr(sink, "experiment",
                                                                           None)
            if hasattr(writer, "add_histogram"):
                self._histograms(writer, spectra, step)

    def _histograms(self, writer, spectra: dict, step: int) -> None:
        for (i, mixer), by_quantity in spectra.items():
            for quantity in self.histograms:
                s = by_quantity.get(quantity)
                if s is not None and s.numel() and torch.isfinite(s).all():
                    writer.add_histogram(f"spectrum/{self.layer_tag(i, mixer)}/{quantity}",
                                         s.float().flatten(), global_step=step)
