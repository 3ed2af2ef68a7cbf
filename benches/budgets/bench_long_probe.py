"""Where a long Hugging Face probe spends its time, and its figures against the exact path.

    python -m benches.budgets.bench_long_probe                      # 1 x 1024, all layers
    python -m benches.budgets.bench_long_probe --seq-len 4096       # the long probe
    python -m benches.budgets.bench_long_probe --seq-len 1024 --layers 0,15,29 --exact
    python -m benches.budgets.bench_long_probe --hf DIR --text FILE --seq-len 8192 --layers 0,29

The model is a randomly initialized one of SmolLM-135M's layout (30 layers, hidden 576, 9
query heads over 3 KV heads of 64, SwiGLU 1536, RoPE, vocab 49152), built offline from a
LlamaConfig, or the one saved in --hf DIR. The ids are the first tokens of --text (raw
bytes modulo the vocab) or, without it, seeded random tokens. The probe runs
matrix-free from --matfree-from (default: the probe length) with --k-max as the report
does (256); each stage's time is printed as its share of the whole, with the peak memory
(maxrss) of the process. --exact probes the same layers again on the exact path
(matfree_from=None), prints the ratio of the two times and compares every figure the
report prints: rank_eps equal where decided, the rest within the tolerances printed.

On a shared machine every time stretches with the load; the shares and the ratio within
one run hold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import sys
import time
from pathlib import Path

import torch

import budgets.capture.attention
import budgets.hf.probe
import budgets.probe.blocks
import budgets.probe.calls
from budgets.hf.probe import probe_hf_model
from budgets.rank.krylov import Lanczos
from budgets.rank.matfree import AttentionOperator
from train.hf.model_dir import import_transformers

LAYOUT = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
              num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
              rope_theta=10000.0, max_position_embeddings=32768, tie_word_embeddings=True,
              rms_norm_eps=1e-5)

# stage -> the functions whose own time (callees' stages taken out) it counts
STAGES = {
    "discovery (projections found by a short forward)": [(budgets.hf.probe, "_call_probe")],
    "attention output P V (the capture)": [(budgets.capture.attention, "attend")],
    "mixing: exact spectra of P": [(budgets.probe.calls, "mixing_figures")],
    "mixing: normalizer and norm pass": [(AttentionOperator, "_normalize")],
    "mixing: products A^T A X": [(AttentionOperator, "gram"),
                                 (AttentionOperator, "block_grams")],
    "mixing: Krylov basis and Ritz pairs": [(Lanczos, "absorb")],
    "mixing: head statistics": [(budgets.probe.blocks, "head_stats_operator")],
    "mixing: bounds and set-up": [(budgets.probe.calls, "mixing_figures_matfree")],
    "other spectra (streams, K/V, weights)": [(budgets.probe.calls.CallProbe, "record")],
    "final hidden state and loss": [(budgets.hf.probe, "final_hidden_metrics"),
                                    (budgets.hf.probe, "_next_token_loss")],
}
REST = "forward pass (the model's own compute)"
# what the matrix-free figures may differ from the exact ones by
TOLERANCE = {"stable_rank": 1e-4, "sigma_1": 1e-5, "sigma_ratio": 1e-4, "erank": 1e-3,
             "participation_ratio": 1e-3, "heads": 1e-5, "other": 1e-4}
MIXING = ("mixing", "mixing_centered", "past_future")


class StageClock:
    """Exclusive seconds per stage of the functions in STAGES while inside."""

    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.stack: list[float] = []  # the callees' seconds of each open call

    def wrap(self, stage: str, fn):
        def timed(*args, **kwargs):
            self.stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent, inner = time.perf_counter() - start, self.stack.pop()
                self.seconds[stage] += spent - inner
                if self.stack:
                    self.stack[-1] += spent
        return timed

    @contextlib.contextmanager
    def watching(self):
        saved = []
        for stage, targets in STAGES.items():
            for owner, name in targets:
                saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, self.wrap(stage, getattr(owner, name)))
        try:
            yield self
        finally:
            for owner, name, fn in reversed(saved):
                setattr(owner, name, fn)


def build_model(hf: Path | None):
    transformers = import_transformers()
    if hf is not None:
        from train.hf.model_dir import load_model
        return load_model(hf, "float32")[0].eval()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**LAYOUT)
    return transformers.LlamaForCausalLM(config).eval()


def probe_ids(text: Path | None, seq_len: int, vocab: int) -> torch.Tensor:
    if text is None:
        return torch.randint(0, vocab, (1, seq_len), generator=torch.Generator().manual_seed(0))
    data = torch.tensor(list(text.read_bytes()[:seq_len]), dtype=torch.long) % vocab
    if data.numel() < seq_len:
        raise SystemExit(f"--text {text}: {data.numel()} bytes, fewer than --seq-len {seq_len}")
    return data[None]  # [1, T]


def timed_probe(model, ids, layers, matfree_from, k_max) -> tuple[dict, float, dict]:
    clock = StageClock()
    start = time.perf_counter()
    with clock.watching():
        probe, _ = probe_hf_model(model, ids, layers=layers, matfree_from=matfree_from,
                                  k_max=k_max)
    total = time.perf_counter() - start
    stages = {**clock.seconds, REST: total - sum(clock.seconds.values())}
    return probe, total, stages


def _rel(a, b) -> float:
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return 0.0
    return abs(a - b) / max(abs(b), 1e-12)


def compare(free: dict, exact: dict) -> dict:
    """Figure by figure: rank_eps (decided heads) equal, the rest's largest relative
    difference per metric, against TOLERANCE."""
    out = {"rank_eps_equal": 0, "rank_eps_decided": 0, "rank_eps_undecided": 0,
           "mismatches": [], "max_rel": dict.fromkeys(TOLERANCE, 0.0)}
    for a, b in zip(free["layers"], exact["layers"], strict=True):
        for q in a["quantities"]:
            fa, fb = a["quantities"][q], b["quantities"][q]
            kind = q if q in MIXING else "other"
            for h, (ra, rb) in enumerate(zip(fa["rank_eps"], fb["rank_eps"], strict=True)):
                if (fa.get("rank_eps_bound") or [0] * len(fa["rank_eps"]))[h]:
                    out["rank_eps_undecided"] += 1
                    continue
                out["rank_eps_decided"] += 1
                out["rank_eps_equal"] += ra == rb
                if ra != rb:
                    out["mismatches"].append((a["layer"], q, h, ra, rb))
            for metric in ("stable_rank", "sigma_1", "sigma_ratio", "erank",
                           "participation_ratio"):
                key = metric if kind != "other" else "other"
                for x, y in zip(fa.get(metric, []), fb.get(metric, []), strict=True):
                    out["max_rel"][key] = max(out["max_rel"][key], _rel(x, y))
        for stat, values in a["heads"].items():
            for x, y in zip(values, b["heads"][stat], strict=True):
                out["max_rel"]["heads"] = max(out["max_rel"]["heads"], _rel(x, y))
        for la, lb in zip(a["past_future_lengths"], b["past_future_lengths"], strict=True):
            for ra, rb in zip(la["rank_eps"], lb["rank_eps"], strict=True):
                if not la["lower_bound"]:
                    out["rank_eps_decided"] += 1
                    out["rank_eps_equal"] += ra == rb
                    if ra != rb:
                        out["mismatches"].append((a["layer"], f"length {la['seq_len']}", 0,
                                                  ra, rb))
    out["within_tolerance"] = all(v <= TOLERANCE[k] for k, v in out["max_rel"].items())
    return out


def undecided(probe: dict) -> dict:
    """Per mixing quantity: heads whose rank_eps reads as a lower bound, of all heads."""
    out = {}
    for q in MIXING:
        flags = [f for layer in probe["layers"]
                 for f in layer["quantities"][q].get("rank_eps_bound") or []]
        out[q] = f"{int(sum(flags))} of {len(flags)}"
    return out


def shares(stages: dict, total: float) -> dict:
    return {k: {"s": round(v, 2), "share": round(v / total, 3)} for k, v in
            sorted(stages.items(), key=lambda kv: -kv[1]) if v > 0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.budgets.bench_long_probe",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf", type=Path, help="a saved model (default: the 135M layout, random)")
    p.add_argument("--text", type=Path, help="the probe's tokens, as bytes (default: random)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--layers", help="e.g. 0,15,29 (default: all)")
    p.add_argument("--matfree-from", type=int, help="default: the probe length")
    p.add_argument("--k-max", type=int, default=256)
    p.add_argument("--exact", action="store_true", help="also the exact path, compared")
    args = p.parse_args(argv)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    model = build_model(args.hf)
    ids = probe_ids(args.text, args.seq_len, int(model.config.vocab_size))
    free, t_free, stages = timed_probe(model, ids, layers, args.matfree_from or args.seq_len,
                                       args.k_max)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    report = {"seq_len": args.seq_len, "layers": len(free["layers"]), "matfree_s": t_free,
              "peak_mib": round(peak), "stages": shares(stages, t_free),
              "undecided": undecided(free)}
    if args.exact:
        exact, t_exact, stages_exact = timed_probe(model, ids, layers, None, args.k_max)
        report.update(exact_s=t_exact, exact_over_matfree=t_exact / t_free,
                      exact_stages=shares(stages_exact, t_exact),
                      comparison=compare(free, exact), tolerance=TOLERANCE)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
