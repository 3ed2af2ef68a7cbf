"""`rankzoo report RUN_DIR --plot DIR`: PNG figures of a finished run, read at a glance.

    written, notes = write_plots(run_dir, report, out_dir)

- spectrum_<variant>.png: each layer's singular-value spectrum s_k / s_1 (log y), one line
  per probed quantity, from the last ranks.jsonl record (only if it holds spectra);
- rank_over_training.png: centered mixing erank and past->future rank_eps per layer vs step,
  one line per (variant, layer), from every ranks.jsonl record;
- declared_vs_realized.png: per axis, declared cap vs realized rank (means over layers).

Figures are drawn on matplotlib's Figure directly (Agg canvas, no pyplot state, no display
needed) and written only into out_dir, which must be new or empty: nothing is overwritten.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from budgets import AXES

from .results import is_variant_dir, rank_records, variant_dirs

SPECTRUM_QUANTITIES = ("mixing_centered", "past_future", "qk", "value")


def prepare_dir(out_dir: Path) -> Path:
    """Create out_dir, refusing an existing file or non-empty directory (never overwrite)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"--plot {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise FileExistsError(f"--plot {out_dir}: directory is not empty; name a new or empty "
                              "directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def run_histories(run_dir: Path) -> dict[str, list[dict]]:
    """variant name -> its ranks.jsonl records (variants without one are left out)."""
    run_dir = Path(run_dir)
    vdirs = [run_dir] if is_variant_dir(run_dir) else variant_dirs(run_dir)
    return {v.name: rank_records(v / "ranks.jsonl") for v in vdirs
            if (v / "ranks.jsonl").is_file()}


def save_figure(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def spectrum_figure(variant: str, record: dict) -> Figure | None:
    """Per layer, s_k / s_1 of each quantity (mean over heads); None without spectra."""
    layers = [ly for ly in record["layers"] if ly.get("spectra")]
    if not layers:
        return None
    fig = Figure(figsize=(4 * len(layers), 3.6), layout="constrained")
    axes = fig.subplots(1, len(layers), squeeze=False)[0]
    for ax, layer in zip(axes, layers, strict=True):
        for quantity, spectra in layer["spectra"].items():
            if quantity in SPECTRUM_QUANTITIES or quantity.startswith(("inference.", "adapter.")):
                _spectrum_line(ax, quantity, spectra)
        ax.set(yscale="log", xlabel="k", ylabel="s_k / s_1",
               title=f"layer {layer['layer']} ({layer.get('block', '')})")
        ax.legend(fontsize=7)
    fig.suptitle(f"{variant}: singular-value spectra at step {record['step']}")
    return fig


def _spectrum_line(ax, quantity: str, spectra) -> None:
    rows = [[float(x) for x in row] for row in spectra]  # [heads][k]
    k = min(len(r) for r in rows)
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(k)]
    if k and mean[0] > 0:  # an all-zero matrix has no spectrum to draw on a log axis
        ax.plot(range(1, k + 1), [max(s / mean[0], 1e-12) for s in mean], label=quantity)


def _layer_mean(layer: dict, quantity: str, metric: str) -> float | None:
    # None: a head whose erank the matrix-free probe could not decide (budgets/matfree.py)
    values = [v for v in layer["quantities"].get(quantity, {}).get(metric, []) if v is not None]
    return sum(values) / len(values) if values else None


def _history(records: list[dict], i: int, quantity: str, metric: str):
    """Steps and layer-i values of one metric, skipping records that lack it."""
    steps, ys = [], []
    for r in records:
        y = _layer_mean(r["layers"][i], quantity, metric) if i < len(r["layers"]) else None
        if y is not None:
            steps.append(r["step"])
            ys.append(y)
    return steps, ys


LINE_STYLES = ("-", "--", ":", "-.")


def history_figure(histories: dict[str, list[dict]]) -> Figure:
    fig = Figure(figsize=(11, 4), layout="constrained")
    panels = fig.subplots(1, 2)
    series = (("mixing_centered", "erank", "centered mixing erank (collapse: <= 2)"),
              ("past_future", "rank_eps", "past->future rank_eps (mixing axis)"))
    for ax, (quantity, metric, title) in zip(panels, series, strict=True):
        # one colour per variant, one line style per layer: 16+ lines stay distinguishable
        for j, (variant, records) in enumerate(histories.items()):
            for i in range(len(records[-1]["layers"])):
                steps, ys = _history(records, i, quantity, metric)
                if steps:
                    ax.plot(steps, ys, color=f"C{j % 10}", linestyle=LINE_STYLES[i % 4],
                            marker="o", markersize=3, label=f"{variant} L{i}")
        ax.set(xlabel="training step", ylabel=metric, title=title)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle("effective rank over training (mean over heads)")
    return fig


def _axis_means(variant: dict, axis: str) -> tuple[float, float] | None:
    rows = [a for ly in variant["layers"] for a in ly["axes"]
            if a["axis"] == axis and a["realized_mean"] is not None]
    if not rows:
        return None
    return (sum(a["declared"] for a in rows) / len(rows),
            sum(a["realized_mean"] for a in rows) / len(rows))


def budget_figure(report: dict) -> Figure:
    variants = report["variants"]
    # only the axes some variant realized (no adapters attached: no empty adapter slot)
    axes = [a for a in AXES if any(_axis_means(v, a) for v in variants)] or list(AXES)
    fig = Figure(figsize=(min(14, max(6, 1.1 * len(axes) * max(1, len(variants)) ** 0.5)), 4.2),
                 layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        label = v["variant"]  # once per variant, on its first drawn axis
        for i, axis in enumerate(axes):
            means = _axis_means(v, axis)
            if means is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, means[0], width, color=f"C{j % 10}", alpha=0.3, edgecolor=f"C{j % 10}")
            ax.bar(x, means[1], width * 0.6, color=f"C{j % 10}", label=label)
            label = None
    ax.set_xticks(range(len(axes)), axes)
    ax.set(ylabel="rank (mean over layers)",
           title="declared cap (pale) vs realized rank_eps (solid), per axis")
    ax.legend(fontsize=8)
    return fig


def write_plots(run_dir, report: dict, out_dir) -> tuple[list[Path], list[str]]:
    """Write the figures of a run into out_dir; returns (files written, notes on skips)."""
    out_dir = prepare_dir(out_dir)
    histories = run_histories(Path(run_dir))  # read everything before writing anything
    written, notes = [], []
    for variant, records in histories.items():
        fig = spectrum_figure(variant, records[-1])
        if fig is None:
            notes.append(f"{variant}: no spectra in its last ranks.jsonl record; "
                         "spectrum figure skipped")
            continue
        written.append(save_figure(fig, out_dir / f"spectrum_{safe_name(variant)}.png"))
    if histories:
        written.append(save_figure(history_figure(histories), out_dir / "rank_over_training.png"))
    else:
        notes.append(f"no ranks.jsonl under {run_dir}: rank-over-training figure skipped")
    written.append(save_figure(budget_figure(report), out_dir / "declared_vs_realized.png"))
    return written, notes


def safe_name(name: str) -> str:
    """A variant name as a file name: no path separators."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
