"""`rankzoo claims`: the low-rank-bottleneck theory's claims as experiments, each with a
verdict rule fixed before any run (docs/CLAIMS.md).

    doc = claims_document(read_runs("runs/claims"))        # or Evidence(probed=...)

One module per claim (depth, strict_effective, long_context, data_rank, optimizers,
lora_rank, softmax_bound, heads, grokking), one row each in registry.py; rule.py holds
what a claim and its outcome are and the seed-noise rules; evidence.py reads runs;
probed.py probes a checkpoint; document.py builds the JSON document.
"""

from .document import SCHEMA, claims_document
from .evidence import Evidence, Probed, Run, read_runs
from .registry import CLAIMS, claim
from .rule import HOLDS, NO_EVIDENCE, PARTLY, REFUTED, UNTESTABLE, VERDICTS, Claim, Outcome

__all__ = ["CLAIMS", "HOLDS", "NO_EVIDENCE", "PARTLY", "REFUTED", "SCHEMA", "UNTESTABLE",
           "VERDICTS", "Claim", "Evidence", "Outcome", "Probed", "Run", "claim",
           "claims_document", "read_runs"]
