"""The report's residual-stream section: per layer, the residual stream beside the normed
input its block reads, and the tokens whose norm towers over the rest.

    out.print(render_residual(report)); Path("report.md").write_text(residual_markdown(report))
"""

from __future__ import annotations

from rich.table import Table

from budgets.advice.rows import row_text

from .table import Column, TableSpec, fmt, to_markdown, to_rich

RESIDUAL_LEGEND = ("resid Hc = centered erank of the residual stream entering the layer "
                   "(before its pre-norm), input Hc = of the normed input the block reads, "
                   "both pooled over the probe batch; massive = tokens whose norm exceeds "
                   "{ratio} the layer's median token norm (position: ratio to the median)")


def massive_text(residual: dict, limit: int = 3) -> str:
    """'pos 0: 177x median; pos 5: 31x median (2 samples)': the largest ratio per position."""
    by_pos: dict[int, list[float]] = {}
    for m in residual.get("massive") or []:
        by_pos.setdefault(m["position"], []).append(m["ratio"])
    items = sorted(by_pos.items(), key=lambda kv: -max(kv[1]))
    parts = [f"pos {pos}: {max(rs):.0f}x median" + (f" ({len(rs)} samples)" if len(rs) > 1
                                                      else "") for pos, rs in items[:limit]]
    if len(items) > limit:
        parts.append(f"+{len(items) - limit} more positions")
    return "; ".join(parts) or "none"


def _residual_rows(report: dict):
    for v in report["variants"]:
        for layer in v["layers"]:
            res = layer.get("residual")
            if res is not None:
                hc = layer.get("input_centered_erank", layer.get("hidden_centered_erank"))
                yield (v["variant"], row_text(layer), fmt(res.get("centered_erank")),
                       fmt(hc), fmt(res.get("norm_median"), ".3g"), massive_text(res))


def _massive_ratio(report: dict) -> str:
    """'20x': the multiple of the median the probe flagged at (where the report states it)."""
    ratios = {(ly.get("residual") or {}).get("massive_ratio") for v in report["variants"]
              for ly in v["layers"]} - {None}
    ratio = (report.get("thresholds") or {}).get("massive_ratio")
    if ratio is None and len(ratios) == 1:
        ratio = ratios.pop()
    return f"{ratio:g}x" if ratio is not None else "the probe's stated multiple of"


def residual_spec(report: dict) -> TableSpec | None:
    """One row per layer the probe measured the residual stream of (None: none did)."""
    rows = list(_residual_rows(report))
    if not rows:
        return None
    return TableSpec(
        title="residual stream beside the normed input",
        heading="Residual stream beside the normed input",
        columns=(Column("variant"), Column("layer", numeric=True),
                 Column("resid Hc", numeric=True), Column("input Hc", numeric=True),
                 Column("median norm", "median", numeric=True), Column("massive tokens")),
        rows=rows, legend=RESIDUAL_LEGEND.format(ratio=_massive_ratio(report)), grouped=1,
        grouped_in_markdown=False)


def render_residual(report: dict) -> Table | None:
    spec = residual_spec(report)
    return None if spec is None else to_rich(spec)


def residual_markdown(report: dict) -> str:
    spec = residual_spec(report)
    return "" if spec is None else to_markdown(spec)
