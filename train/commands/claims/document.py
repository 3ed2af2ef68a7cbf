"""The claims document (schema rankzoo.claims): each claim, its rule, and its verdict on
the evidence given. `--format json` prints it; the table and figures draw from it."""

from __future__ import annotations

from dataclasses import asdict

from .evidence import Evidence
from .registry import CLAIMS, claim

SCHEMA, VERSION = "rankzoo.claims", 1


def claims_document(ev: Evidence, names: list[str] | None = None) -> dict:
    """Every claim (or those named) judged on `ev`, in the registry's order."""
    chosen = [claim(n) for n in names] if names else list(CLAIMS.values())
    return {"schema": SCHEMA, "version": VERSION, "sources": sources(ev),
            "claims": [entry(c, ev) for c in chosen]}


def entry(c, ev: Evidence) -> dict:
    outcome = asdict(c.judge(ev))
    return {"claim": c.name, "sentence": c.sentence, "source": c.source,
            "quantity": c.quantity, "metrics": c.metrics, "rule": c.rule,
            "thresholds": c.thresholds, "evidence": list(c.evidence), **outcome}


def sources(ev: Evidence) -> dict:
    out: dict = {"constructed": True}
    if ev.runs_dir is not None:
        out["runs"] = {"dir": ev.runs_dir, "runs": [f"{r.experiment}/{r.name}" for r in ev.runs]}
    if ev.probed is not None:
        p = ev.probed.probe
        out["hf"] = {"model": ev.probed.name, "seq_len": p["seq_len"], "eps": p["eps"],
                     "probe_size": p["batch_size"], "layers": len(p["layers"])}
    return out
