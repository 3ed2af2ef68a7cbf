"""`rankzoo report RUN_DIR --plot DIR`: PNG figures of a finished run, read at a glance.

    histories = rank_histories(run_dir)  # the caller reads the run (train/rundir/read.py)
    written, notes = write_plots(histories, report, out_dir, run_dir)

- spectrum_<variant>.png: each layer's singular-value spectrum s_k / s_1 (log y), one line
  per probed quantity, from the last ranks.jsonl record (only if it holds spectra); one
  panel per layer in a grid of at most MAX_COLUMNS columns;
- rank_over_training.png: small multiples, one panel per layer: centered mixing erank
  (solid) and past->future rank_eps (dashed) vs step, the variant as the colour, from every
  ranks.jsonl record;
- heads_<variant>.png: layer x head heatmaps per axis (first-token mass, raw erank,
  past->future rank, head class), from the report's per-layer "heads" (or, in a report
  without them, from the per-head figures it has);
- declared_vs_realized.png: per axis, declared cap vs realized rank (means over layers).

Every figure is bounded: at most MAX_PIXELS (width, height) at DPI, whatever the number of
layers, heads or variants, with panels shrunk to fit. Figures are drawn on matplotlib's
Figure directly (Agg canvas, no pyplot state, no display needed) and written only into
out_dir, which must be new or empty: nothing is overwritten. Nothing here reads a run
directory: the records come in from the caller.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogLocator, MaxNLocator, NullLocator

from budgets.advice.rows import row_text

from ..rundir.files import atomic_path
from .heads import HEAD_CLASSES
from .recall import recall_figure, recall_view

SPECTRUM_QUANTITIES = ("mixing_centered", "past_future", "qk", "value", "out")
DPI = 110
MAX_COLUMNS = 8              # panels per row of a grid; more layers add rows
MAX_PIXELS = (2400, 3000)    # (width, height) bound of every figure at DPI
PANEL_INCHES = (2.9, 2.3)    # a grid panel's size before the bound shrinks it
# the report's axes, by part: pretrain (mixing .. out = W_O), adapter, inference
PLOT_AXES = ("mixing", "logits", "value_path", "out", "adapter", "inference")
CLASS_COLOURS = ("#9e9e9e", "#d62728", "#1f77b4", "#ff7f0e", "#2ca02c")  # HEAD_CLASSES order


def prepare_dir(out_dir: Path, create: bool = True) -> Path:
    """Create out_dir (unless not `create`: only the checks), refusing an existing file or
    non-empty directory (never overwrite)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"--plot {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise FileExistsError(f"--plot {out_dir}: directory is not empty; name a new or empty "
                              "directory")
    if create:
        out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir


def save_figure(fig: Figure, path: Path) -> Path:
    """Write the figure whole or not at all (its format named: the temporary file's name
    does not end in it)."""
    with atomic_path(path) as tmp:  # no bbox_inches="tight": the size stays the bounded one
        fig.savefig(tmp, dpi=DPI, format=Path(path).suffix.lstrip(".") or None)
    return path


def bounded_size(width: float, height: float) -> tuple[float, float]:
    """(width, height) in inches, clipped to MAX_PIXELS at DPI."""
    return min(width, MAX_PIXELS[0] / DPI), min(height, MAX_PIXELS[1] / DPI)


def grid(n: int, legend_rows: int = 1):
    """A figure of n panels, at most MAX_COLUMNS per row, bounded in size, with room for a
    title above and legend_rows of a shared legend below; (fig, axes[:n]), the unused cells
    of the last row hidden. Margins are fixed in inches (no constrained layout: with 30+
    panels it costs seconds per figure)."""
    cols = max(1, min(MAX_COLUMNS, n))
    rows = max(1, math.ceil(n / cols))
    top, bottom = 0.55, 0.5 + 0.22 * legend_rows  # inches: title; x labels and the legend
    width, height = bounded_size(cols * PANEL_INCHES[0], rows * PANEL_INCHES[1] + top + bottom)
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.55 / width, right=1 - 0.15 / width, top=1 - top / height,
                        bottom=bottom / height, wspace=0.3, hspace=0.45)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    for ax in axes[:n]:  # few ticks: readable when small, and fast to draw
        ax.xaxis.set_major_locator(MaxNLocator(4, integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(4))
        ax.tick_params(labelsize=7)
    return fig, list(axes[:n])


def _label_outer(axes: list, cols: int, xlabel: str, ylabel: str) -> None:
    """Axis labels on the left column and the bottom panel of each column only."""
    for i, ax in enumerate(axes):
        if i % cols == 0:
            ax.set_ylabel(ylabel, fontsize=8)
        if i + cols >= len(axes):
            ax.set_xlabel(xlabel, fontsize=8)


def colours(names, cmap: str | None = None) -> dict:
    """A distinct colour per name: tab10 up to 10 names, tab20 up to 20, then a sampled map."""
    names = list(dict.fromkeys(names))
    if cmap is None:
        cmap = "tab10" if len(names) <= 10 else "tab20" if len(names) <= 20 else "turbo"
    cm = colormaps[cmap]
    if cmap in ("tab10", "tab20"):
        return {n: cm(i) for i, n in enumerate(names)}
    return {n: cm(i / max(1, len(names) - 1)) for i, n in enumerate(names)}


LEGEND_COLUMNS = 6


def legend_rows(n_handles: int) -> int:
    return max(1, math.ceil(n_handles / LEGEND_COLUMNS))


def _shared_legend(fig: Figure, handles: list, title: str | None = None) -> None:
    """One legend for the whole figure, below the panels (never over a line)."""
    if handles:
        fig.legend(handles=handles, loc="lower center", fontsize=8, title=title,
                   title_fontsize=8, ncol=min(len(handles), LEGEND_COLUMNS), frameon=False)


# ---------------------------------------------------------------- spectra

def _spectrum_quantities(layer: dict) -> list[str]:
    return [q for q in layer["spectra"]
            if q in SPECTRUM_QUANTITIES or q.startswith(("inference.", "adapter."))]


def spectrum_figure(variant: str, record: dict) -> Figure | None:
    """Per layer, s_k / s_1 of each quantity (mean over heads); None without spectra. One
    panel per layer, at most MAX_COLUMNS per row, one colour per quantity in every panel
    and one legend for all."""
    layers = [ly for ly in record["layers"] if ly.get("spectra")]
    if not layers:
        return None
    quantities = colours(q for ly in layers for q in _spectrum_quantities(ly))
    fig, axes = grid(len(layers), legend_rows(len(quantities)) + 1)  # + 1: its title
    for ax, layer in zip(axes, layers, strict=True):
        for quantity in _spectrum_quantities(layer):
            _spectrum_line(ax, layer["spectra"][quantity], color=quantities[quantity])
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(numticks=4))
        ax.yaxis.set_minor_locator(NullLocator())  # log minor ticks: the slow part to draw
        ax.set_title(f"L{layer['layer']} {layer.get('block', '')}", fontsize=8)
    _label_outer(axes, min(MAX_COLUMNS, len(axes)), "k", "s_k / s_1")
    _shared_legend(fig, [Line2D([], [], color=c, label=q) for q, c in quantities.items()],
                   "quantity")
    fig.suptitle(f"{variant}: singular-value spectra at step {record['step']} "
                 "(mean over heads)")
    return fig


def _spectrum_line(ax, spectra, color) -> None:
    rows = [[float(x) for x in row] for row in spectra]  # [heads][k]
    k = min(len(r) for r in rows)
    mean = [sum(r[i] for r in rows) / len(rows) for i in range(k)]
    if k and mean[0] > 0:  # an all-zero matrix has no spectrum to draw on a log axis
        ax.plot(range(1, k + 1), [max(s / mean[0], 1e-12) for s in mean], color=color,
                linewidth=1)


# ---------------------------------------------------------------- rank over training

def _layer_mean(layer: dict, quantity: str, metric: str) -> float | None:
    # None: a head whose erank the matrix-free probe could not decide (budgets/rank/matfree.py)
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


# (quantity, metric, label, line style): both are ranks, so they share a panel's y axis
HISTORY_SERIES = (("mixing_centered", "erank", "centered mixing erank", "-"),
                  ("past_future", "rank_eps", "past->future rank_eps", "--"))


def _layer_names(histories: dict[str, list[dict]], n: int) -> list[str]:
    names = [f"layer {i}" for i in range(n)]
    for records in histories.values():
        for i, layer in enumerate(records[-1]["layers"]):
            names[i] = f"L{layer['layer']} {layer.get('block', '')}".strip()
    return names


def history_figure(histories: dict[str, list[dict]]) -> Figure:
    """Small multiples: one panel per layer, one colour per variant, solid = centered mixing
    erank, dashed = past->future rank_eps; one legend for the figure."""
    n_layers = max(len(records[-1]["layers"]) for records in histories.values())
    variant_colours = colours(histories)
    handles = ([Line2D([], [], color=c, label=v) for v, c in variant_colours.items()]
               + [Line2D([], [], color="black", linestyle=ls, label=label)
                  for _, _, label, ls in HISTORY_SERIES])
    fig, axes = grid(n_layers, legend_rows(len(handles)))
    for i, (ax, name) in enumerate(zip(axes, _layer_names(histories, n_layers), strict=True)):
        for variant, records in histories.items():
            for quantity, metric, _, style in HISTORY_SERIES:
                steps, ys = _history(records, i, quantity, metric)
                if steps:
                    ax.plot(steps, ys, color=variant_colours[variant], linestyle=style,
                            marker="o", markersize=2, linewidth=1)
        ax.set_title(name, fontsize=8)
    _label_outer(axes, min(MAX_COLUMNS, n_layers), "training step", "rank")
    _shared_legend(fig, handles)
    fig.suptitle("effective rank over training, per layer (mean over heads)")
    return fig


# ---------------------------------------------------------------- heads

def _pad(rows: list[list]) -> list[list[float]]:
    """[layers][heads] with missing heads (a layer with fewer heads, a null) as NaN."""
    width = max((len(r) for r in rows), default=0)
    return [[math.nan if x is None else float(x) for x in r] + [math.nan] * (width - len(r))
            for r in rows]


def _past_future_row(layer: dict) -> list | None:
    row = next((a for a in layer["axes"] if a["quantity"] == "past_future"), None)
    return None if row is None else row["per_head"]


def head_panels(variant: dict) -> list[tuple[str, list[list[float]], bool]]:
    """(title, [layers][heads] values, categorical) per panel with any data: from each
    layer's "heads", else from the per-head figures the report has (past->future rank_eps
    of the axis row, the HF report's raw mixing eranks)."""
    layers = variant["layers"]
    heads = [ly.get("heads") or {} for ly in layers]

    def column(get) -> list[list]:
        return [get(ly, h) or [] for ly, h in zip(layers, heads, strict=True)]

    panels = [
        ("first-token mass", column(lambda ly, h: h.get("first_token_mass")), False),
        ("raw mixing erank", column(lambda ly, h: h.get("raw_erank")
                                    or (ly.get("erank") or {}).get("mixing")), False),
        ("past->future rank (max over samples)", column(lambda ly, h: h.get("past_future_max")),
         False),
        ("past->future rank_eps (mean over samples)",
         column(lambda ly, h: None if h.get("past_future_max") else _past_future_row(ly)), False),
        ("head class", column(lambda ly, h: [None if c not in HEAD_CLASSES
                                             else HEAD_CLASSES.index(c)
                                             for c in h.get("class") or []]), True),
    ]
    return [(title, _pad(rows), cat) for title, rows, cat in panels
            if any(x is not None for r in rows for x in r)]


def heads_figure(variant: dict) -> Figure | None:
    """Layer x head heatmaps, one panel per axis (see head_panels); None without any
    per-head figure. Bounded: panels shrink to fit MAX_PIXELS."""
    panels = head_panels(variant)
    if not panels:
        return None
    n_layers, n_heads = len(variant["layers"]), max(len(p[1][0]) for p in panels)
    panel_w = min(5.0, max(2.6, 0.25 * n_heads + 1.4))
    fig = Figure(figsize=bounded_size(panel_w * len(panels), 0.22 * n_layers + 1.8),
                 layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    labels = [row_text(ly) for ly in variant["layers"]]
    for ax, (title, values, categorical) in zip(axes, panels, strict=True):
        _heatmap(fig, ax, values, categorical, labels)
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"{variant['variant']}: per head (rows: layers, columns: heads)")
    return fig


def _heatmap(fig: Figure, ax, values, categorical: bool, labels: list[str]) -> None:
    if categorical:
        cmap = ListedColormap(CLASS_COLOURS)
        norm = BoundaryNorm([i - 0.5 for i in range(len(HEAD_CLASSES) + 1)], cmap.N)
    else:
        cmap, norm = colormaps["viridis"], None
    cmap = cmap.with_extremes(bad="#e0e0e0")  # a head the layer lacks, a figure not measured
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    bar = fig.colorbar(image, ax=ax, shrink=0.8)
    if categorical:
        bar.set_ticks(range(len(HEAD_CLASSES)), labels=HEAD_CLASSES)
    bar.ax.tick_params(labelsize=7)
    n_layers, n_heads = len(values), len(values[0])
    step = max(1, math.ceil(n_layers / 32))  # at most 32 layer labels
    ax.set_yticks(range(0, n_layers, step), labels[::step])
    ax.set_xticks(range(0, n_heads, max(1, math.ceil(n_heads / 16))))
    ax.set(xlabel="head", ylabel="layer")
    ax.tick_params(labelsize=7)
    if n_layers * n_heads <= 64 and not categorical:  # small: the numbers fit in the cells
        for y, row in enumerate(values):
            for x, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(x, y, f"{v:.2g}", ha="center", va="center", fontsize=6,
                            color="white")


# ---------------------------------------------------------------- declared vs realized

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
    axes = [a for a in PLOT_AXES if any(_axis_means(v, a) for v in variants)] or list(
        PLOT_AXES[:3])
    fig = Figure(figsize=bounded_size(
        min(14, max(6, 1.1 * len(axes) * max(1, len(variants)) ** 0.5)), 4.2),
        layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(variants)
    variant_colours = colours(v["variant"] for v in variants)
    for j, v in enumerate(variants):
        label, colour = v["variant"], variant_colours[v["variant"]]
        for i, axis in enumerate(axes):
            means = _axis_means(v, axis)
            if means is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, means[0], width, color=colour, alpha=0.3, edgecolor=colour)
            ax.bar(x, means[1], width * 0.6, color=colour, label=label)
            label = None  # once per variant, on its first drawn axis
    ax.set_xticks(range(len(axes)), [_axis_label(a) for a in axes])
    ax.set(ylabel="rank (mean over layers)",
           title="declared cap (pale) vs realized rank_eps (solid), per axis")
    ax.legend(fontsize=8, ncol=max(1, math.ceil(len(variants) / 8)))
    return fig


def _axis_label(axis: str) -> str:
    part = "pretrain" if PLOT_AXES.index(axis) < 4 else axis
    return f"{'W_O' if axis == 'out' else axis}\n({part})"


# ---------------------------------------------------------------- writing

def write_plots(histories: dict[str, list[dict]], report: dict, out_dir,
                run_dir) -> tuple[list[Path], list[str]]:
    """Write the figures of a run into out_dir; returns (files written, notes on skips).
    `histories`: each variant's rank records (train/rundir/read.py rank_histories), read
    by the caller before anything is written; `run_dir` names the run in the notes."""
    out_dir = prepare_dir(out_dir)
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
    return written + _write_report_figures(report, out_dir, notes), notes


def _write_report_figures(report: dict, out_dir: Path, notes: list[str]) -> list[Path]:
    """The figures drawn from the report alone: heads, declared vs realized, and recall vs
    capacity for MQAR runs with per-count accuracies."""
    written = _write_heads(report, out_dir, notes)
    written.append(save_figure(budget_figure(report), out_dir / "declared_vs_realized.png"))
    view = recall_view(report)
    if view is not None:
        written.append(save_figure(recall_figure(view), out_dir / "recall_vs_capacity.png"))
    return written


def _write_heads(report: dict, out_dir: Path, notes: list[str]) -> list[Path]:
    written = []
    for v in report["variants"]:
        fig = heads_figure(v)
        if fig is None:
            notes.append(f"{v['variant']}: no per-head figures in the report; heads figure "
                         "skipped")
        else:
            written.append(save_figure(fig, out_dir / f"heads_{safe_name(v['variant'])}.png"))
    return written


def write_probe_plots(name: str, entry: dict, report: dict,
                      out_dir) -> tuple[list[Path], list[str]]:
    """The figures of one probed model (`report --hf`): spectra (if probed with them), its
    heads, declared vs realized; out_dir new or empty, as for write_plots."""
    out_dir = prepare_dir(out_dir)
    written, notes = [], []
    fig = spectrum_figure(name, {"step": entry["step"], "layers": entry["probe"]["layers"]})
    if fig is None:
        notes.append(f"{name}: the probe holds no spectra; spectrum figure skipped")
    else:
        written.append(save_figure(fig, out_dir / f"spectrum_{safe_name(name)}.png"))
    return written + _write_report_figures(report, out_dir, notes), notes


def safe_name(name: str) -> str:
    """A variant name as a file name: no path separators."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
