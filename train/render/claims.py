"""The claims document for people: one table (claim, test, figure, verdict) and, with
--plot, the figure each claim rests on. Everything is drawn from the document."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

VERDICT_STYLE = {"holds": "green", "refuted": "red", "holds partly": "yellow",
                 "not testable as stated": "magenta", "no evidence": "dim"}


def claims_table(doc: dict) -> Table:
    t = Table(title="claims of the low-rank-bottleneck theory, as tested", show_lines=True)
    for column in ("claim", "test", "figure", "verdict"):
        t.add_column(column, overflow="fold")
    for c in doc["claims"]:
        verdict = c["verdict"] + (f": {c['why']}" if c["why"] else "")
        style = VERDICT_STYLE.get(c["verdict"], "")
        t.add_row(f"[bold]{c['claim']}[/bold]\n{c['sentence']}",
                  c["test"] + (f"\n[dim]{c['used']}[/dim]" if c["used"] else ""),
                  c["figure"], f"[{style}]{verdict}[/{style}]" if style else verdict)
    return t


def claims_markdown(doc: dict) -> str:
    """The verdict table in Markdown (the README's)."""
    rows = ["| claim | figure | verdict |", "|---|---|---|"]
    for c in doc["claims"]:
        verdict = c["verdict"] + (f" ({c['why']})" if c["why"] else "")
        rows.append(f"| {c['claim']} | {c['figure']} | {verdict} |")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- figures

def write_claims_plots(doc: dict, out_dir: Path) -> list[Path]:
    """One PNG per claim with a figure to draw (its `plot`), into out_dir (prepared)."""
    from .plots import save_figure

    written = []
    for c in doc["claims"]:
        draw = DRAW.get((c.get("plot") or {}).get("kind"))
        if draw is not None:
            written.append(save_figure(draw(c), Path(out_dir) / f"claim_{c['claim']}.png"))
    return written


def _figure(c: dict, xlabel: str, ylabel: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.add_subplot()
    ax.set_title(f"{c['claim']}: {c['verdict']}", fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.subplots_adjust(bottom=0.15, left=0.15)
    return fig, ax


def _depth(c: dict):
    fig, ax = _figure(c, "layer", "rank_0.01 of P_c (mean over heads)")
    for name, curve in c["plot"]["series"].items():
        ax.plot(range(len(curve)), curve, marker="o", label=name)
    ax.legend(fontsize=7)
    return fig


def _optimizers(c: dict):
    """W_V's erank (the claim's metric), stable rank and rank_eps per optimizer, a point
    per seed."""
    from matplotlib.figure import Figure

    values = c["plot"]["values"]
    names = sorted(values)
    metrics = [m for m in ("erank", "stable_rank", "rank_eps")
               if all(m in f for seeds in values.values() for f in seeds.values())]
    fig = Figure(figsize=(3.0 * len(metrics), 3.6))
    fig.suptitle(f"{c['claim']}: {c['verdict']}", fontsize=10)
    for j, metric in enumerate(metrics):
        ax = fig.add_subplot(1, len(metrics), j + 1)
        for i, opt in enumerate(names):
            ys = [f[metric] for f in values[opt].values()]
            ax.scatter([i] * len(ys), ys, color=f"C{i}")
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.set_title(f"W_V {metric}" + (" (the claim's)" if metric == c["plot"]["metric"]
                                        else ""), fontsize=9)
    fig.subplots_adjust(wspace=0.4, top=0.82)
    return fig


def _data_rank(c: dict):
    fig, ax = _figure(c, "data's logit rank r", "W_V erank (largest layer)")
    xs, ys = zip(*c["plot"]["points"], strict=True)
    ax.plot(xs, ys, "o", label="runs")
    ax.plot([min(xs), max(xs)], [min(xs), max(xs)], "--", color="grey", label="erank = r")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    return fig


def _lora(c: dict):
    fig, ax = _figure(c, "LoRA rank r", "fine-tune val loss")
    xs, ys = zip(*c["plot"]["points"], strict=True)
    ax.plot(xs, ys, marker="o")
    ax.axvspan(*c["plot"]["band"], alpha=0.15, color="green", label="a ln d, a in [1, 3]")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)
    return fig


def _grokking(c: dict):
    """Per seed: validation accuracy (solid, left) and W_V erank (dashed, right)."""
    fig, ax = _figure(c, "step", "validation accuracy (solid)")
    right = ax.twinx()
    right.set_ylabel("W_V erank, mean over layers (dashed)")
    for i, (seed, series) in enumerate(sorted(c["plot"]["seeds"].items())):
        color = f"C{i}"
        steps, acc = zip(*series["accuracy"], strict=True)
        ax.plot(steps, acc, color=color, label=f"seed {seed}")
        rs, rank = zip(*series["erank"], strict=True)
        right.plot(rs, rank, "--", color=color)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="center right")
    fig.subplots_adjust(right=0.85)
    return fig


def _strict_effective(c: dict):
    fig, ax = _figure(c, "head (layers in order)", "share of T")
    ax.plot(c["plot"]["strict"], "o", label="numerical rank of P / T")
    ax.plot(c["plot"]["effective"], "s", label="rank_0.01(P_c) / T")
    ax.legend(fontsize=7)
    return fig


DRAW = {"depth": _depth, "optimizers": _optimizers, "data_rank": _data_rank, "lora": _lora,
        "grokking": _grokking, "strict_effective": _strict_effective}


def claims_rules_table(doc: dict) -> Table:
    """`rankzoo claims --list`: each claim, its source and its verdict rule."""
    t = Table(title="claims and their verdict rules (fixed before any run)", show_lines=True)
    for column in ("claim", "source", "quantity", "rule", "evidence"):
        t.add_column(column, overflow="fold")
    for c in doc["claims"]:
        t.add_row(f"[bold]{c['claim']}[/bold]\n{c['sentence']}", c["source"], c["quantity"],
                  c["rule"], ", ".join(c["evidence"]))
    return t
