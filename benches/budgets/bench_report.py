"""Where `rankzoo report --hf` spends its time on the exact path, by eigensolver workers.

    python -m benches.budgets.bench_report                        # 1 x 1024, one vs all
    python -m benches.budgets.bench_report --base /tmp/base       # and an earlier checkout
    python -m benches.budgets.bench_report --rounds 2 --seq-len 512
    python -m benches.budgets.bench_report --device cuda          # on a GPU (benches/gpu.sh)

The model is a randomly initialized one of SmolLM-135M's layout (30 layers, hidden 576,
9 query heads over 3 KV heads of 64: benches/budgets/bench_long_probe.py), saved once to a
temporary directory; the probe batch is seeded random tokens. Each run is a fresh process
that loads the model, probes every layer exactly (T < matfree_from, as the report at
1 x 1024) and builds the report, and prints its split:

  load       the saved model read back (train/hf/model_dir.py load_model)
  capture    the forward pass, attention output P V included (what is left over)
  P          the softmax probabilities (budgets/capture/attention.py probabilities)
  spectra    Gram products and eigensolvers (budgets/rank/spectra.py, pooled K/V ranks)
  figures    the metrics and entries around them, and the report's document

Runs: "one" (the batch on one worker: one LAPACK thread, as before), "all" (the workers
eigen.py's timed probe chose: its choice is printed), and with --base DIR "base" (the code
in DIR, e.g. a `git worktree` of an earlier commit, on the same model). --rounds repeats
the runs interleaved (one, all, base, one, ...); the ratios are of each mode's fastest
run. The machine (CPU model, cores, load average before and after) is printed: on a
shared machine every time stretches with the load, the ratios within one run hold. With
--device cuda the model and its spectra are on the GPU (each layer's batch one call), and
only "all" (and "base") run: the CPU workers do not apply there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("load", "capture", "P", "spectra", "figures")


class Clock:
    """Exclusive seconds per stage of wrapped functions (a callee's stage taken out).
    bench_long_probe.py's StageClock does the same; this file runs as a script against an
    earlier checkout's packages (--base), whose benches may lack it, so it imports nothing
    from benches/."""

    def __init__(self):
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.stack: list[float] = []

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


def _targets():
    """(stage, owner, attribute) of what each stage counts; those the code lacks skipped."""
    import budgets.capture.attention as attention
    import budgets.hf.probe as hf_probe
    import budgets.probe.calls as calls
    import budgets.probe.streams as streams
    import budgets.rank.spectra as spectra

    found = [("P", attention, "probabilities"), ("spectra", streams, "gram_rank_eps"),
             ("spectra", spectra, "_pair_values"), ("figures", calls, "mixing_figures"),
             ("figures", calls.CallProbe, "record"),
             ("figures", hf_probe, "final_hidden_metrics")]
    return [(s, o, a) for s, o, a in found if hasattr(o, a)]


@contextlib.contextmanager
def watching(clock: Clock):
    import budgets.rank.spectra as spectra

    saved = [(o, a, getattr(o, a)) for _, o, a in _targets()]
    methods = dict(spectra.METHODS)
    for stage, owner, attr in _targets():
        setattr(owner, attr, clock.wrap(stage, getattr(owner, attr)))
    for name, fn in methods.items():  # spectrum() looks its method up at each call
        spectra.METHODS[name] = clock.wrap("spectra", fn)
    try:
        yield clock
    finally:
        for owner, attr, fn in reversed(saved):
            setattr(owner, attr, fn)
        spectra.METHODS.update(methods)


def _workers(mode: str):
    """The eigensolver setting of a mode, and its description (None: the code has none)."""
    try:
        from budgets.rank.eigen import eig_plan, forced_workers
    except ImportError:  # an earlier checkout: one LAPACK thread per call
        return contextlib.nullcontext(), None
    if mode == "one":
        solver = getattr(eig_plan(), "solver_text", None)  # an earlier eigen.py: torch's
        return forced_workers(1), "1 worker x 1 thread (forced)" + (
            f"; {solver()}" if solver else "")
    return contextlib.nullcontext(), eig_plan().describe()


def child(model_dir: str, seq_len: int, mode: str, device: str = "cpu") -> dict:
    """One run's split (in this process)."""
    from budgets.hf.probe import build_hf_report, probe_hf_model
    from train.hf.model_dir import load_model

    clock = Clock()
    start = time.perf_counter()
    model = load_model(Path(model_dir), "float32")[0].to(device)
    clock.seconds["load"] = time.perf_counter() - start
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (1, seq_len),
                        generator=torch.Generator().manual_seed(0)).to(device)
    setting, eigensolver = _workers(mode) if device == "cpu" else (
        contextlib.nullcontext(), f"one batched call on {device}")
    start = time.perf_counter()
    with setting, watching(clock):
        probe, loss = probe_hf_model(model, ids)
        build = time.perf_counter()
        entry = {"probe": probe, "step": 0, "params": 0, "metrics": {"probe/loss": loss},
                 "source": {"model_type": "llama", "text": "random", "tokens": "random",
                            "probe_size": 1, "seq_len": seq_len}}
        json.dumps(build_hf_report("bench", entry))
        clock.seconds["figures"] += time.perf_counter() - build
    if device != "cpu":
        torch.cuda.synchronize()
    probed = time.perf_counter() - start
    clock.seconds["capture"] = probed - sum(clock.seconds[s] for s in STAGES[2:])
    total = probed + clock.seconds["load"]
    return {"mode": mode, "device": device, "eigensolver": eigensolver,
            "total_s": round(total, 2),
            "split": {s: round(v, 2) for s, v in clock.seconds.items()},
            "shares": {s: round(v / total, 3) for s, v in clock.seconds.items()}}


def machine() -> dict:
    name = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return {"cpu": name, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def run_child(mode: str, model_dir: str, seq_len: int, base: Path | None,
              device: str = "cpu") -> dict:
    env = dict(os.environ)
    code = ROOT if mode != "base" else base
    env["PYTHONPATH"] = str(code)  # the packages from `code`, this file run as a script
    cmd = [sys.executable, str(Path(__file__)), "--child", mode, "--model-dir", model_dir,
           "--seq-len", str(seq_len), "--device", device]
    out = subprocess.run(cmd, env=env, cwd=str(code), capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"the {mode} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ratios(runs: list[dict]) -> dict:
    best = {}
    for r in runs:
        if r["mode"] not in best or r["total_s"] < best[r["mode"]]["total_s"]:
            best[r["mode"]] = r
    out = {}
    for a, b in (("all", "one"), ("all", "base"), ("one", "base")):
        if a in best and b in best:
            out[f"{a}/{b}"] = {"total": round(best[a]["total_s"] / best[b]["total_s"], 3),
                               "spectra": round(best[a]["split"]["spectra"]
                                                / max(best[b]["split"]["spectra"], 1e-9), 3)}
    return out


def save_model(directory: str) -> None:
    from benches.budgets.bench_long_probe import build_model

    build_model(None).save_pretrained(directory)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.budgets.bench_report",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--base", type=Path, help="a checkout of earlier code, run beside")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--child", choices=("one", "all", "base"), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.model_dir, args.seq_len, args.child, args.device)))
        return 0
    modes = [*(["one"] if args.device == "cpu" else []), "all", *(["base"] if args.base else [])]
    with tempfile.TemporaryDirectory(prefix="bench_report_") as model_dir:
        save_model(model_dir)
        before = machine()
        runs = []
        for _ in range(args.rounds):
            for mode in modes:
                runs.append(run_child(mode, model_dir, args.seq_len, args.base, args.device))
                print(json.dumps(runs[-1]), file=sys.stderr)
    report = {"machine": {**before, "load_average_after": machine()["load_average"]},
              "seq_len": args.seq_len, "batch": 1, "runs": runs, "ratios": ratios(runs)}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
