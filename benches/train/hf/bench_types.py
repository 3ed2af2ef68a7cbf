"""Per model type the HF probe is checked on: the figures it measures, how far the captured
P and logits are from eager attention's (and a rebuilt SSD mixing from the scan's output),
and the seconds of a report at 2 x 64 tokens.

    python -m benches.train.hf.bench_types            # one line per type (tests/hf_tiny.py)

Tiny random models (hidden 64) are built offline and saved into a temporary directory;
the text is random printable bytes (no tokenizer: ids are bytes modulo the vocabulary).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from budgets.capture.scan import rebuild
from budgets.hf.capture import capture
from budgets.hf.probe import build_hf_report
from budgets.hf.scans import capture_scans
from tests.hf_tiny import TINY, VOCAB, tiny_model
from train.hf.model_dir import import_transformers, quiet
from train.hf.probe import probe_hf, zoo_blocks

B, T = 2, 64


@torch.no_grad()
def eager_gap(model) -> tuple[float | None, float, float | None]:
    """(max |P - eager P| or None without attention, max |logits - eager logits|, max
    |rebuilt SSD mixing output - the scan's| or None without an SSD mixer) on random ids."""
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    eager = model(input_ids=ids, output_attentions=True, use_cache=False)
    calls = []
    with capture(model, calls.append, keep_probs=True), \
            capture_scans(model, lambda call: None) as scans:
        out = model(input_ids=ids, use_cache=False)
    attentions = [a for a in (eager.get("attentions") or ()) if a is not None]
    gap = max((float((c.probs - a).abs().max()) for c, a in zip(calls, attentions,
                                                                 strict=True)), default=None)
    scan = max((float((rebuild(c) - c.y.double()).abs().max()) for c in scans), default=None)
    return gap, float((out.logits - eager.logits).abs().max()), scan


def _gap(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def row(model_type: str, root: Path, text: Path) -> str:
    model = tiny_model(model_type)
    p_gap, logit_gap, scan_gap = eager_gap(model)
    with quiet(import_transformers()):
        model.save_pretrained(root / model_type)
    start = time.perf_counter()
    name, entry = probe_hf(root / model_type, text, seq_len=T, probe_size=B, device="cpu")
    report = build_hf_report(name, entry, zoo_blocks=zoo_blocks())
    seconds = time.perf_counter() - start
    layers = report["variants"][0]["layers"]
    figures = sorted({a["quantity"] for ly in layers for a in ly["axes"]})
    kinds = ", ".join(k["kind"] for k in report["kinds"])
    missing = "; ".join(sorted({m for ly in layers for m in ly.get("not_measured", [])}))
    return (f"| {model_type} | {len(layers)} | {kinds} | {' '.join(figures)} | "
            f"{_gap(p_gap)} | {logit_gap:.1e} | {_gap(scan_gap)} | {seconds:.2f} | "
            f"{missing or '-'} |")


def main() -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"report --hf at {B} x {T} tokens, tiny random models (tests/hf_tiny.py), "
          f"{torch.get_num_threads()} threads")
    print("| model type | layers | kinds | figures | max abs P - eager | max abs logits - "
          "eager | max abs SSD rebuild - scan | seconds | not measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = root / "text.txt"
        g = torch.Generator().manual_seed(0)
        text.write_bytes(bytes(torch.randint(32, 127, (B * T * 4,), generator=g).tolist()))
        for model_type in sys.argv[1:] or TINY:
            print(row(model_type, root, text), flush=True)


if __name__ == "__main__":
    main()
