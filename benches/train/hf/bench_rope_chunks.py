"""RoPE however it is written, and chunked attention, through `report --hf` on the tiny
random models the tests build offline (tests/hf_tiny.py):

    python -m benches.train.hf.bench_rope_chunks

For llama4_text (chunks of 16 on layers 0-2, NoPE on layer 3), gemma4_text (RoPE on
[B, T, H, K], one tensor at a time) and longcat_flash (MLA, interleaved RoPE written
de-interleaved): per layer, in fp64 on 2 x 64 tokens, the kind the capture reads and the
largest |P - P_eager| against transformers' eager attention with output_attentions=True;
then `report --hf --seq-len 64 --probe-size 1 --format json`: its exit code and the kind of
each layer, by the model's own number.
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

TYPES = ("llama4_text", "gemma4_text", "longcat_flash")
B, T = 2, 64


@torch.no_grad()
def against_eager(model_type: str) -> None:
    model = tiny_model(model_type, fp64=True)
    ids = torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    eager = model(input_ids=ids, output_attentions=True)
    calls: list = []
    with capture(model, calls.append, keep_probs=True):
        logits = model(input_ids=ids).logits
    print(f"{model_type}, fp64, {B} x {T} tokens: max |logits captured - eager| "
          f"{float((logits - eager.logits).abs().max()):.1e}")
    for i, (call, P) in enumerate(zip(calls, eager.attentions, strict=True)):
        print(f"  call {i}: {call.kind(False)['label']}, "
              f"max |P - P_eager| = {float((call.probs - P).abs().max()):.1e}")


def report(path: Path, text: Path) -> None:
    code, doc, problems = report_hf(path, text, T, 1)
    line = f"report --hf {path.name} --seq-len {T} --probe-size 1: exit {code}"
    if doc is not None:
        layers = doc["variants"][0]["layers"]
        line += "; " + ", ".join(f"layer {ly['layer']}: {ly['kind']['label']}" for ly in layers)
    print(line + "".join(f"\n  {x}" for x in problems))


def main() -> None:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    for model_type in TYPES:
        against_eager(model_type)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        text = probe_text(root)
        for model_type in TYPES:
            with quiet(import_transformers()):
                tiny_model(model_type).save_pretrained(root / model_type)
            report(root / model_type, text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
