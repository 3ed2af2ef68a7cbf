"""The short answer a report opens with: one screen, before the per-layer details.

    out.print(render_answer(report)); Path("report.md").write_text(answer_markdown(report))

Per variant one row: how its run ended, the metric it is judged by, and its budget in one
line (per part, the realized ranks summed over rows and layers against the declared caps
summed the same way); a hybrid's table per kind of layer (its pattern's sub-blocks against
their caps, as `report --hf` shows a checkpoint's); then at most three advice items, the
ones that change a model first (a KV cache item in one line: its bytes, ratio and basis,
and the loss compress measured; its full text in the details), and the verdicts of a check
experiment's run (the advice verified or refuted by training). Everything else (every row, head and
finding) is in the details: `--details` in the terminal, always in report.md and JSON.
"""

from __future__ import annotations

from dataclasses import asdict

from rich.console import Group
from rich.text import Text

from budgets.advice.annotate import solved
from budgets.advice.verdicts import VerdictThresholds
from budgets.cache import KEY_LABEL, CostModel
from budgets.report.document import PARTS

from .advice import advice_text, check_style
from .kinds import variant_kinds_specs
from .parts import part_of
from .table import Column, TableSpec, fmt, to_markdown, to_rich

TOP_ADVICE = 3
# the order in which advice items earn a place in the answer: what changes a model first
PRIORITY = ("cheaper_block", "hybrid", "kv_cache_summary", "lora_rank", "grows_with_t", "collapsed",
            "no_advice", "kv_cache", "note")
KEY_METRICS = ("val/accuracy", "val/loss", "probe/loss")


def key_metric(variant: dict) -> str:
    """The figure a variant is judged by: accuracy where the task has one, else loss."""
    metrics = variant.get("metrics") or {}
    name = next((m for m in KEY_METRICS if metrics.get(m) is not None), None)
    return "-" if name is None else f"{name} {metrics[name]:.3g}"


def speed(variant: dict) -> str:
    """Its training's tokens per second (over the fit's wall time), `-` where none."""
    return fmt((variant.get("metrics") or {}).get("tokens_per_second"), ",.0f")


def outcome(variant: dict, th: VerdictThresholds) -> str:
    """'finished, solved', 'finished, learned', 'stopped at 300/600', 'probed'."""
    s = variant.get("status")
    if s is None:
        return "probed" if variant.get("source") or not variant.get("step") else "-"
    if s.get("state") != "finished":
        of = f"/{s['max_steps']}" if s.get("max_steps") else ""
        return f"{s.get('state')} at {s.get('step')}{of}"
    is_solved, _ = solved(variant, th)
    if is_solved:
        return "finished, solved"
    learned = {True: "learned", False: "did not learn", None: "finished"}[s.get("learned")]
    return "finished" if learned == "finished" else f"finished, {learned}"


def budget_line(variant: dict) -> str:
    """'pretrain 96/128 · adapter - · inference 40/64': per part, realized (the mean over
    heads and samples, summed over rows and layers) of declared (summed alike)."""
    sums = {p: [0.0, 0] for p in PARTS}
    for layer in variant["layers"]:
        for row in layer["axes"]:
            part = sums[part_of(row)]
            part[0] += row.get("realized_mean") or 0.0
            part[1] += row.get("declared") or 0
    return " · ".join(f"{p} {fmt(r, '.0f')}/{d}" if d else f"{p} -"
                      for p, (r, d) in sums.items())


def _best_option(item: dict) -> tuple[str, dict]:
    """(key kind, option) of a KV item with the largest ratio."""
    return max(item["options"].items(), key=lambda kv: kv[1].get("ratio") or 0.0)


def _kv_headline(item: dict) -> str:
    """'mqa: a low-rank KV cache, 96 B/token of codes for 128 (1.33x; keys before RoPE +
    values, one basis shared by every sequence, 1536 B once per model)'; the measured loss
    when compress measured it."""
    key, opt = _best_option(item)
    where = item["variant"] + (f" layer {item['layer']}" if "layer" in item else "")
    keys = KEY_LABEL.get(key, "keys") if item.get("rope") or key == "k_pre_rope" else "keys"
    basis = (f"one basis shared by every sequence, {opt['basis_bytes']} B once per model"
             if opt.get("cost_model") == CostModel.SHARED
             else f"a basis per sequence, {opt['basis_bytes']} B at T = {item.get('seq_len')}")
    text = (f"{where}: a low-rank KV cache, {opt['cache_bytes_per_token']:.0f} B/token for "
            f"{item['full_bytes_per_token']} ({opt['ratio']:.2f}x; {keys} + values, {basis})")
    m = item.get("measured")
    if m:
        text += (f"; measured {m['delta_loss']:+.4f} nats per token at {m['ratio']:.2f}x: "
                 f"{m['verdict']}")
    return text


# advice kind -> its one-line form in the summary (the full text is in the details)
HEADLINES = {"kv_cache_summary": _kv_headline, "kv_cache": _kv_headline}


def headline(item: dict) -> str:
    return HEADLINES.get(item["kind"], advice_text)(item)


def top_advice(report: dict, n: int = TOP_ADVICE) -> list[dict]:
    """The n advice items that matter most (PRIORITY, then report order)."""
    items = list(report.get("advice", []))
    rank = {kind: i for i, kind in enumerate(PRIORITY)}
    return sorted(items, key=lambda a: rank.get(a["kind"], len(PRIORITY)))[:n]


def answer_spec(report: dict) -> TableSpec:
    th = VerdictThresholds(**{k: v for k, v in (report.get("thresholds") or {}).items()
                              if k in asdict(VerdictThresholds()) and k != "heads"})
    trained = any("tokens_per_second" in (v.get("metrics") or {}) for v in report["variants"])
    rows = [(v["variant"], outcome(v, th), key_metric(v), *([speed(v)] if trained else []),
             budget_line(v)) for v in report["variants"]]
    return TableSpec(  # tokens/s beside the key metric for runs that trained
        title=f"summary: {report.get('experiment') or '(unnamed)'}", heading="Summary",
        columns=(Column("variant"), Column("status"), Column("key metric"),
                 *([Column("tokens/s", numeric=True)] if trained else []),
                 Column("budget: realized / declared, summed per part")),
        rows=rows)


def _more(report: dict) -> str:
    """'2 more advice items, 6 findings' (what only the details show), or ''."""
    rest = len(report.get("advice", [])) - TOP_ADVICE
    findings = len(report.get("findings", []))
    parts = [f"{rest} more advice item{'s' * (rest > 1)}"] if rest > 0 else []
    parts += [f"{findings} finding{'s' * (findings > 1)}"] if findings else []
    return ", ".join(parts)


def render_answer(report: dict, details_hint: str = "") -> Group:
    """The summary table, the top advice, and what the details hold."""
    lines: list = [to_rich(answer_spec(report))]
    lines += [to_rich(spec) for spec in variant_kinds_specs(report)]  # a hybrid's kinds
    for item in top_advice(report):
        lines.append(Text(f"- {headline(item)}", style="yellow"
                          if item["kind"] == "no_advice" else ""))
    for item in report.get("advice_checks", []):
        lines.append(Text(f"- {item['text']}", style=check_style(item)))
    more = _more(report)
    hint = "; ".join(x for x in (f"also: {more}" if more else "", details_hint) if x)
    if hint:
        lines.append(Text(hint, style="dim"))
    return Group(*lines)


def answer_markdown(report: dict) -> str:
    lines = [to_markdown(answer_spec(report)).rstrip("\n"), ""]
    lines += [to_markdown(spec, level=3).rstrip("\n") + "\n"
              for spec in variant_kinds_specs(report)]
    top = top_advice(report)
    if top:
        lines += ["Top advice:", "", *(f"- {headline(a)}" for a in top), ""]
    checks = report.get("advice_checks", [])
    if checks:
        lines += ["Advice checked by training:", "", *(f"- {a['text']}" for a in checks), ""]
    more = _more(report)
    if more:
        lines += [f"({more}: below.)", ""]
    return "\n".join(lines)
