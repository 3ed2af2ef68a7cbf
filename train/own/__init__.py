"""A model of the user's own (`rankzoo report --model pkg.module:factory`): built from an
importable factory, its weights from a checkpoint, probed on a text through a tokenizer or
as bytes (budgets/probe/own.py measures it through its SDPA calls).

    model = load_own_model("mygpt.model:small", checkpoint="ckpt.pt")
    report = report_own("mygpt.model:small", "corpus.txt", checkpoint="ckpt.pt")
"""

from .load import load_own_model, report_own

__all__ = ["load_own_model", "report_own"]
