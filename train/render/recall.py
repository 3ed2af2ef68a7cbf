"""Recall against capacity: what a side-by-side MQAR comparison is for.

    view = recall_view(report)          # None unless the variants carry per-count accuracies
    out.print(recall_table(view)); recall_markdown(view); fig = recall_figure(view)

Zoology's central result is that a block recalls as many key-value associations as the
state it carries from the context to the queries can hold. rankzoo measures that state
directly: the past->future block M[T/2:, :T/2] of a layer's mixing matrix is everything
the second half of a sequence reads from the first half, and its rank_eps is the number of
directions it carries. Per variant the view puts side by side:

  carried   the past->future rank realized on the probe (largest sample and head, then
            the largest layer), beside its declared cap; a layer pattern carries what its
            widest layer carries (a local/global hybrid: its global layers)
  cache     bytes a sequence's cache or state holds at the probe's length, all layers, at
            bf16 (the report's declared cache elements x 2)
  accuracy  validation accuracy per number of key-value pairs (val/accuracy/kv<n>)

and one sentence computed from them: how the variants that carry at least as many
directions as the largest number of pairs recall, against those that carry fewer, and the
rank correlation of carried rank with that accuracy.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from .table import BOXED, Column, TableSpec, fmt, to_markdown, to_rich

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KV_METRIC = re.compile(r"^val/accuracy/kv(\d+)$")
CACHE_BYTES = 2  # bf16: what a cache is usually kept in, whatever the training precision


def _carried(variant: dict) -> tuple[int | None, int | None]:
    """(realized past->future rank, its declared cap): the largest over layers."""
    rows = [a for ly in variant["layers"] for a in ly["axes"] if a["quantity"] == "past_future"]
    realized = [a.get("realized_max_sample") or a.get("realized_max") for a in rows]
    realized = [math.ceil(r - 1e-9) for r in realized if r is not None]
    declared = [a["declared"] for a in rows]
    return (max(realized) if realized else None), (max(declared) if declared else None)


def _row(variant: dict) -> dict | None:
    acc = {int(m.group(1)): v for k, v in variant["metrics"].items() if (m := KV_METRIC.match(k))}
    if not acc:
        return None
    carried, cap = _carried(variant)
    cache = (variant.get("budget") or {}).get("model", {}).get("cache_elements")
    status = variant.get("status") or {}
    layers = variant["layers"]  # none in a report.json cut down by hand
    # a layer pattern names its blocks in order of first appearance: "sliding_window+softmax"
    blocks = "+".join(dict.fromkeys(ly["block"] for ly in layers)) or "-"
    return {"variant": variant["variant"], "block": blocks,
            "carried": carried, "cap": cap,
            "cache_bytes": None if cache is None else cache * CACHE_BYTES,
            "accuracy": dict(sorted(acc.items())), "learned": status.get("learned")}


def recall_view(report: dict) -> dict | None:
    """The view's data (JSON-ready), or None when no variant has per-count accuracies."""
    rows = [r for v in report["variants"] if (r := _row(v)) is not None]
    if not rows:
        return None
    counts = sorted({n for r in rows for n in r["accuracy"]})
    return {"counts": counts, "cache_dtype": "bfloat16", "rows": rows,
            "sentence": sentence(rows, counts[-1])}


def ranks_of(xs: list[float]) -> list[float]:
    """Ranks 1..n with ties averaged (for Spearman's rho)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation; None with fewer than 3 points or a constant side."""
    if len(xs) < 3:
        return None
    rx, ry = ranks_of(xs), ranks_of(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def _group(rows: list[dict], n: int) -> str:
    mean = sum(r["accuracy"][n] for r in rows) / len(rows)
    names = ", ".join(f"{r['variant']} {r['carried']}" for r in rows)
    return f"{mean:.2f} on average ({names})"


def sentence(rows: list[dict], n: int) -> str:
    """The view's conclusion at n pairs, computed from its rows. A variant that did not
    learn the task is left out (and named): its accuracy is the optimizer's story, not
    the capacity's."""
    rows = [r for r in rows if r["carried"] is not None and n in r["accuracy"]]
    left_out = [r["variant"] for r in rows if r["learned"] is False]
    rows = [r for r in rows if r["learned"] is not False]
    tail = f" Left out, as they did not learn the task: {', '.join(left_out)}." if left_out else ""
    if not rows:
        return (f"no variant that learned has both a measured past->future rank and an "
                f"accuracy at {n} pairs.{tail}")
    return _conclusion(rows, n) + tail


def _conclusion(rows: list[dict], n: int) -> str:
    enough = [r for r in rows if r["carried"] >= n]
    fewer = [r for r in rows if r["carried"] < n]
    if enough and fewer:
        text = (f"At {n} key-value pairs, the variants whose layers carry past->future rank "
                f">= {n} recall {_group(enough, n)}; those carrying fewer directions recall "
                f"{_group(fewer, n)}.")
    else:
        side = "at least" if enough else "fewer than"
        text = (f"Every variant carries {side} {n} past->future directions, so capacity does "
                f"not separate them at {n} pairs: accuracy {_group(rows, n)}.")
    rho = spearman([r["carried"] for r in rows], [r["accuracy"][n] for r in rows])
    if rho is not None:
        text += (f" Across the {len(rows)} variants, Spearman's rho of carried rank and "
                 f"accuracy is {rho:.2f}.")
    return text


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _cells(view: dict, r: dict) -> list[str]:
    carried = "-" if r["carried"] is None else f"{r['carried']} / {r['cap']}"
    learned = {True: "yes", False: "no", None: "-"}[r["learned"]]
    return [r["variant"], r["block"], carried, _fmt_bytes(r["cache_bytes"]),
            *(fmt(r["accuracy"].get(n), ".2f") for n in view["counts"]),
            learned]


HEADERS = ("variant", "block", "carried / cap", "cache")
LEGEND = ("carried = past->future rank_eps realized on the probe (largest sample, head and "
          "layer) / its declared cap; cache = bytes per sequence at the probe's length, all "
          "layers, bf16; acc@n = validation accuracy with n key-value pairs")


def recall_spec(view: dict) -> TableSpec:
    """One row per variant; the terminal's caption is the view's sentence, the Markdown's
    legend explains the columns (the sentence follows its table)."""
    numbers = (*HEADERS[2:], *(f"acc@{n}" for n in view["counts"]), "learned")
    return TableSpec(
        title="recall vs capacity", heading="Recall vs capacity",
        columns=(*(Column(h) for h in HEADERS[:2]),
                 *(Column(h, numeric=True, wrap=True) for h in numbers)),
        rows=[_cells(view, r) for r in view["rows"]], legend=view["sentence"],
        markdown_legend=LEGEND)


def recall_table(view: dict) -> Table:
    return to_rich(recall_spec(view), **{**BOXED, "box": box.SIMPLE_HEAD})


def recall_markdown(view: dict) -> str:
    return to_markdown(recall_spec(view)) + "\n" + view["sentence"] + "\n"


def recall_figure(view: dict) -> Figure:
    """Accuracy per number of pairs (left) and at the largest number against the carried
    rank (right, the dashed line at rank = pairs)."""
    # matplotlib only where a figure is drawn: the table and report.md (every `rankzoo
    # report`) do without it
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    n = view["counts"][-1]
    for i, r in enumerate(view["rows"]):
        colour = f"C{i % 10}"
        counts = list(r["accuracy"])
        left.plot(counts, [r["accuracy"][c] for c in counts], marker="o", color=colour,
                  label=r["variant"])
        if r["carried"] is not None and n in r["accuracy"]:
            right.scatter(r["carried"], r["accuracy"][n], color=colour)
            right.annotate(r["variant"], (r["carried"], r["accuracy"][n]), fontsize=8,
                           xytext=(3, 3), textcoords="offset points")
    left.set(xlabel="key-value pairs", ylabel="val accuracy", xscale="log", ylim=(0, 1.05),
             title="recall per number of pairs")
    left.set_xticks(view["counts"], [str(c) for c in view["counts"]])
    left.legend(fontsize=7, ncol=2)
    right.axvline(n, color="grey", linestyle="--", linewidth=1)
    right.set(xlabel="carried past->future rank", ylabel=f"val accuracy at {n} pairs",
              ylim=(0, 1.05), title="recall vs carried rank")
    return fig
