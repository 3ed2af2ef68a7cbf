"""A capture never changes the model: on the tiny random models the tests build offline
(tests/hf_tiny.py), llama (SmolLM2's shape of attention) and the two DSA types:

    python -m benches.train.hf.bench_faithful

Per model, in fp64 at 2 x 64 tokens: each layer's largest |P - P_eager| (the capture's P
against transformers' eager `output_attentions`) and the logits' largest change under the
capture; then `rankzoo report --hf` at 2 x 64 tokens in fp32: the exit code, the kinds
reported, the captured and uncaptured next-token losses and their tolerance
(`source.loss_check`), and for DSA the indexer's line; last, the same report with the
capture made to drop DSA's selection (as it did before it read `indices`): exit 2 and its
one line.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import torch

import budgets.hf.capture as hf_capture
from benches.train.hf.cli_run import probe_text, report_hf
from budgets.hf.capture import capture
from tests.hf_tiny import VOCAB, tiny_model
from train.hf.model_dir import import_transformers, quiet
from train.render.indexer import indexer_line

B, T = 2, 64
TYPES = ("llama", "deepseek_v32", "glm_moe_dsa")


@torch.no_grad()
def against_eager(model_type: str) -> None:
    model = tiny_model(model_type, fp64=True)
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    eager = model(input_ids=ids, output_attentions=True)
    calls: list = []
    with capture(model, calls.append, keep_probs=True):
        captured = model(input_ids=ids).logits
    errors = ", ".join(f"{float((c.probs - P).abs().max()):.1e}"
                       for c, P in zip(calls, eager.attentions, strict=True))
    print(f"{model_type}, fp64, {B} x {T}: max |P - P_eager| per layer [{errors}]; "
          f"max |logits captured - eager| {float((captured - eager.logits).abs().max()):.1e}")


def report(path: Path, text: Path) -> None:
    code, doc, problems = report_hf(path, text, T, B)
    line = f"  report --hf {path.name} --seq-len {T} --probe-size {B}: exit {code}"
    if doc is not None:
        c = doc["source"]["loss_check"]
        line += ("; kinds " + ", ".join(f"{k['kind']} (layers {k['layers']})"
                                        for k in doc["kinds"])
                 + f"; loss captured {c['captured']:.7f}, uncaptured {c['uncaptured']:.7f}, "
                   f"tolerance {c['tolerance']:g}")
        indexer = indexer_line(doc)
        line += f"\n    {indexer}" if indexer else ""
    print(line + "".join(f"\n    {x}" for x in problems))


@contextlib.contextmanager
def selection_dropped():
    """The capture as it was before it read `indices`: DSA's top-k left out of the mask."""
    real = hf_capture.selection_of

    def dropped(*args):
        sel = real(*args)
        sel.fold = lambda mask, T, Tk, dtype: mask
        return sel
    hf_capture.selection_of = dropped
    try:
        yield
    finally:
        hf_capture.selection_of = real


def main() -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = probe_text(root)
        for model_type in TYPES:
            against_eager(model_type)
            with quiet(import_transformers()):
                tiny_model(model_type).save_pretrained(root / model_type)
            report(root / model_type, text)
        print("the capture made to drop DSA's selection:")
        with selection_dropped():
            for model_type in TYPES[1:]:
                report(root / model_type, text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
