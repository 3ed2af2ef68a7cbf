"""`rankzoo compress`'s document drawn: the table (rich and Markdown) and the figure.

    out.print(compress_table(doc));  Path("compress.md").write_text(compress_markdown(doc))
    write_plot(doc, "plots")                  # plots/compress.png

The terminal table and the Markdown are one TableSpec (train/render/table.py), the
verdict its legend; the figure is the loss change against the cache's bytes per token.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.table import Table

from .table import TableSpec, columns, fmt, to_markdown, to_rich

COLUMNS = ("setting", "ratio", "B/token", "bases B", "r per layer", "heads per layer",
           "energy kept", "eval loss", "predicted Δ", "Δ loss")
TEXT_COLUMNS = ("setting", "r per layer", "heads per layer")
# wider than the compact style: rich's default padding, as this table has always been drawn
STYLE = {"pad_edge": True, "padding": (0, 1)}


def setting_name(row: dict) -> str:
    """How a measured row's setting is named, in the table and in the verdict's text (a
    checked allocation that kept the uniform ranks says so)."""
    if row["allocation"] == "advised":
        return "the advised ranks"
    if row["allocation"] == "eps":
        return f"rank_eps at eps {row['target']:g}"
    kept = (row.get("check") or {}).get("kept")
    fell_back = " (uniform kept)" if kept == "uniform" else ""
    return f"{row['allocation']} for {row['target']:g}x{fell_back}"


def metric_name(doc: dict) -> str:
    """accuracy for a zoo run (labelled positions), perplexity for a Hugging Face model."""
    return "accuracy" if any("accuracy" in r for r in doc["rows"]) else "perplexity"


def row_cells(row: dict, metric: str) -> list[str]:
    name = "full cache" if row["allocation"] == "full" else setting_name(row)
    return [name, fmt(row["ratio"], ".2f") + "x", fmt(row["bytes_per_token"], ".1f"),
            fmt(row.get("basis_bytes"), ".0f"), row["ranks_summary"],
            row.get("choices_summary") or "-", fmt(row["retained_energy"], ".4f"),
            fmt(row["loss"], ".4f"), fmt(row.get("predicted_delta_loss"), "+.4f"),
            fmt(row["delta_loss"], "+.4f"),
            fmt(row.get(metric), ".4f" if metric == "accuracy" else ".3f")]


def header(doc: dict) -> str:
    src = doc["source"]
    name = src.get("variant") or src.get("hf")
    cal, ev = doc["calibration"], doc["evaluation"]
    used = ", ".join(f"{k} {v}" for k, v in ((doc.get("bases") or {}).get("used") or {}).items())
    cost = ("B/token: the codes alone, the shared bases a weight (bases B, once per model)"
            if "cost_model" in doc else f"bases amortized at T = {doc['length']}")
    return (f"compress {name}: {doc['model']}; {used or 'energy'} bases; cache at "
            f"{doc['cache_dtype']} ({doc['bytes_per_element']} B/element); {cost}; "
            f"calibration {cal['sequences']} sequences ({cal['tokens']} tokens), evaluation "
            f"{ev['sequences']} sequences ({ev['tokens']} tokens)")


def compress_spec(doc: dict) -> TableSpec:
    """Every measured setting, the full cache first; the verdict as the legend."""
    metric = metric_name(doc)
    names = (*COLUMNS, metric)
    return TableSpec(columns=columns(*names, numeric=set(names) - set(TEXT_COLUMNS)),
                     rows=[row_cells(r, metric) for r in doc["rows"]], title=header(doc),
                     legend=f"verdict: {doc['verdict']['text']}" + _agreement(doc))


def _agreement(doc: dict) -> str:
    """The legend's second line: heads per layer's letters, and how well the predictions
    agreed with the measurement."""
    text = doc.get("agreement", {}).get("text")
    if text is None:
        return ""
    return ("\nheads per layer: KV heads kept full (f), low rank (r), read through a window "
            f"and sinks (w), neighbouring layers that choose alike as one entry (3-15 every "
            f"4: layers 3, 7, 11, 15); {text}")


def compress_table(doc: dict) -> Table:
    table = to_rich(compress_spec(doc), **STYLE)
    # eight columns with wide headers: held unwrapped at their headers' width, the figures
    # would leave the setting and its ranks four characters in an 80-column terminal, so
    # here figures fold like names, as this table always drew them
    for column in table.columns:
        column.no_wrap, column.min_width, column.overflow = False, None, "fold"
    return table


def compress_markdown(doc: dict) -> str:
    """The table under a level-1 heading, then the verdict, the advice checked, the notes."""
    table = to_markdown(replace(compress_spec(doc), legend=""), level=1)
    lines = ["", f"**Verdict**: {doc['verdict']['text']}"]
    if doc.get("agreement"):
        lines += ["", f"**Predicted vs measured**: {doc['agreement']['text']}."]
    if doc.get("prediction"):
        lines += ["", f"Advice checked: {doc['prediction']['source']}."]
    lines += [f"- {n}" for n in doc.get("notes", [])]
    return table + "\n".join(lines) + "\n"


def compress_figure(doc: dict):
    """Δ loss vs bytes per token at T, one line per allocation, the report's predicted
    size marked, the tolerance drawn."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    rows = doc["rows"]
    for alloc, marker in (("uniform", "o"), ("greedy", "s"), ("sensitivity", "v"),
                          ("mixed", "P"), ("eps", "^")):
        pts = sorted((r["bytes_per_token"], r["delta_loss"]) for r in rows
                     if r["allocation"] == alloc)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=marker, label=alloc)
    full = rows[0]
    ax.plot([full["bytes_per_token"]], [0.0], "k*", markersize=10, label="full cache")
    for r in rows:
        if r["allocation"] == "advised":
            ax.plot([r["bytes_per_token"]], [r["delta_loss"]], "rD", markersize=8,
                    label=f"advised ({r['ratio']:.2f}x)")
    pred = doc.get("prediction")
    if pred is not None:
        ax.axvline(full["bytes_per_token"] / pred["ratio"], color="red", linestyle="--",
                   linewidth=1, label=f"report: {pred['ratio']:.2f}x")
    _loss_axes(ax, doc)
    return fig


def _loss_axes(ax, doc: dict) -> None:
    """The tolerance line, the scales, the labels and the legend."""
    ax.axhline(doc["tolerance"], color="grey", linestyle=":", linewidth=1,
               label=f"tolerance {doc['tolerance']:g}")
    # symlog: linear within the tolerance (where the verdict is decided), log beyond it
    linear = max(doc["tolerance"], 1e-3)
    ax.set_yscale("symlog", linthresh=linear)
    deltas = [r["delta_loss"] for r in doc["rows"]]
    ax.set_ylim(min(1.5 * min(deltas), -0.5 * linear), max(2 * max(deltas), 2 * linear))
    ax.set_xlim(left=0)
    ax.set_xlabel(f"cache bytes per token at T = {doc['length']} ({doc['cache_dtype']})")
    ax.set_ylabel("Δ eval loss (nats per token)")
    name = doc["source"].get("variant") or Path(doc["source"].get("hf", "")).name
    ax.set_title(f"{name}: loss vs cache size", fontsize=10)
    ax.legend(fontsize=8)


def write_plot(doc: dict, out_dir) -> Path:
    """compress.png in out_dir."""
    from .plots import save_figure

    return save_figure(compress_figure(doc), Path(out_dir) / "compress.png")
