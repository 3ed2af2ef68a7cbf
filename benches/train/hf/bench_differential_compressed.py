"""Differential attention and compressed slots through `report --hf`, on the tiny random
models the tests build offline (tests/hf_tiny.py):

    python -m benches.train.hf.bench_differential_compressed

diffllama: per layer its lambda and how exactly M = P1 - lambda P2 rebuilds the module's
difference (its group norm's input) in fp64, max |M @ V - d| / max |d|, and the logits'
largest change under the capture; then `report --hf` at 1 x 64 tokens on both models: the
exit code and the kinds reported, or the one-line error.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

from benches.train.hf.cli_run import probe_text, report_hf
from budgets.hf.capture import capture
from tests.hf_tiny import VOCAB, tiny_model
from train.hf.model_dir import import_transformers, quiet

B, T = 2, 64


@torch.no_grad()
def differential_errors() -> None:
    model = tiny_model("diffllama", fp64=True)
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    before_norm = {}
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.groupnorm.register_forward_pre_hook(
            lambda m, args, i=i: before_norm.__setitem__(i, args[0]))
    plain = model(input_ids=ids).logits
    calls: list = []
    with capture(model, calls.append, keep_probs=True):
        captured = model(input_ids=ids).logits
    print(f"diffllama, fp64, {B} x {T} tokens: {len(calls)} calls for "
          f"{len(model.model.layers)} layers; max |logits captured - uncaptured| "
          f"{float((captured - plain).abs().max()):.1e}")
    for i, call in enumerate(calls):
        d = (call.exact() @ call.values()).transpose(1, 2)  # [B, T, H/2, 2V]
        error = float((d - before_norm[i]).abs().max() / before_norm[i].abs().max())
        print(f"  layer {i}: {call.kind(False)['label']}, lambda {float(call.lam[0]):+.3f}, "
              f"max |M @ V - d| / max |d| = {error:.1e}")


def report(path: Path, text: Path) -> None:
    code, doc, problems = report_hf(path, text, T, 1)
    line = f"report --hf {path.name} --seq-len {T} --probe-size 1: exit {code}"
    if doc is not None:
        line += "; kinds " + ", ".join(f"{k['kind']} (layers {k['layers']})"
                                       for k in doc["kinds"])
    print(line + "".join(f"\n  {x}" for x in problems))


def main() -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    differential_errors()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = probe_text(root)
        for model_type in ("diffllama", "deepseek_v4"):
            with quiet(import_transformers()):
                tiny_model(model_type).save_pretrained(root / model_type)
            report(root / model_type, text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
