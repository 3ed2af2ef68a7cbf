"""The lm-evaluation-harness scores a run's variants carry (`rankzoo eval RUN/VARIANT`
keeps them as eval.json; train/rundir/read.py attaches them as "lm_eval"): one row per
variant, task and metric, beside the rank figures of the rest of the report."""

from __future__ import annotations

from .table import Column, TableSpec, fmt


def evals_spec(report: dict) -> TableSpec | None:
    """The scores' table, or None where no variant has any."""
    rows = [(v["variant"], task, metric, fmt(value, ".4g"))
            for v in report["variants"] for task, metrics in (v.get("lm_eval") or {}).items()
            for metric, value in sorted(metrics.items())]
    if not rows:
        return None
    return TableSpec(title="lm-eval", heading="lm-evaluation-harness",
                     columns=(Column("variant"), Column("task"), Column("metric"),
                              Column("value", numeric=True)),
                     rows=rows, grouped=2,
                     legend="rankzoo eval's scores of the exported variant (its eval.json)")


def evals_tables(report: dict) -> list:
    """The scores' rich table, as a list: [] where no variant has any."""
    from .table import BOXED, to_rich

    spec = evals_spec(report)
    return [] if spec is None else [to_rich(spec, **BOXED)]
