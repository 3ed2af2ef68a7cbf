"""Advice checked against an outcome: what acting on the report's advice measured.

    notes = attach_measured(report, read_compressed(["mha.json"]))   # compress documents
    docs, notes = read_recorded(run_dir, report)   # each variant's compress.json (--record)
    notes = check_kv(run_dir, report)       # `report --check`: compress at the advised ranks
    raw = emit_check(report, run_dir, "check.yaml")   # `report --emit-check`
    attach_checks(report, recorded_checks(run_dir))   # a check run: verified / refuted

measured.py puts the loss change `rankzoo compress` measured at the advised ranks beside
each KV advice item; emit.py writes the experiment that trains a cheaper block's
suggestion beside the variant it was advised for; outcome.py reads such a run back and
says whether the suggestion held.
"""

from .emit import emit_check
from .measured import attach_measured, check_kv, read_compressed, read_recorded
from .outcome import attach_checks, recorded_checks

__all__ = ["attach_checks", "attach_measured", "check_kv", "emit_check", "read_compressed",
           "read_recorded", "recorded_checks"]
