"""rankzoo claims: the registry, each verdict rule applied to given figures, the softmax
counterexample, the JSON document and the CLI's errors. No training here: runs are
synthetic run directories (config.yaml, ranks.jsonl) written by the test."""

from __future__ import annotations

import json
import pkgutil
from pathlib import Path

import pytest
import torch

import train.commands.claims as claims_pkg
import zoo
from train.cli import main
from train.commands.claims import (
    CLAIMS,
    HOLDS,
    NO_EVIDENCE,
    PARTLY,
    REFUTED,
    UNTESTABLE,
    Evidence,
    Probed,
    Run,
    claims_document,
    data_rank,
    depth,
    grokking,
    lora_rank,
    optimizers,
    read_runs,
)
from train.commands.claims import softmax_bound as sb
from train.commands.claims.plan import read_plan
from train.config.load import load_experiment

ROOT = Path(__file__).resolve().parents[4]
BUDGET = zoo.build("softmax", d_model=64, n_heads=4).budget(16).to_dict()


def layer(i: int, value_erank: float = 10.0, centered: list[float] | None = None,
          numerical: list[float] | None = None) -> dict:
    """A probe layer with the quantities the claims read."""
    q = lambda **m: {"rank_eps": m.get("rank_eps", [1.0]), "erank": m.get("erank", [1.0]),  # noqa: E731
                     **{k: v for k, v in m.items() if k not in ("rank_eps", "erank")}}
    centered = centered or [4.0] * 4
    return {"layer": i, "block": "softmax", "budget": BUDGET, "quantities": {
        "value": q(rank_eps=[value_erank], erank=[value_erank], stable_rank=[value_erank / 2]),
        "mixing": q(rank_eps=[4.0] * 4, numerical_rank=numerical or [16.0] * 4, shape=[16, 16]),
        "mixing_centered": q(rank_eps=centered, shape=[16, 16])}}


def record(step: int, layers: list[dict], eps: float = 0.01, seq_len: int = 16) -> dict:
    return {"step": step, "seq_len": seq_len, "eps": eps, "batch_size": 2, "layers": layers}


def run(experiment: str, name: str, records: list[dict], seed: int = 0, optimizer="adamw",
        data=None, metrics=None, scalars=None, learned=None) -> Run:
    config = {"seed": seed, "train": {"optimizer": optimizer}, "data": data or {},
              "model": {"d_model": 64}}
    return Run(experiment, name, config, records, metrics or {}, scalars or {}, learned)


# ---------------------------------------------------------------- the registry

def test_every_claim_module_is_registered_and_documented():
    modules = {m.name for m in pkgutil.iter_modules(claims_pkg.__path__)}
    with_claim = {m for m in modules
                  if hasattr(__import__(f"train.commands.claims.{m}", fromlist=["CLAIM"]),
                             "CLAIM")}
    assert with_claim == set(CLAIMS)
    docs = (ROOT / "docs" / "CLAIMS.md").read_text()
    for name, c in CLAIMS.items():
        assert c.sentence.endswith(".") and c.source and c.rule and c.thresholds
        assert c.metrics.startswith("docs/METRICS.md")
        assert f"`{name}`" in docs, f"docs/CLAIMS.md does not describe {name}"


def test_document_schema_and_no_evidence():
    doc = claims_document(Evidence())
    json.dumps(doc, allow_nan=False)
    assert doc["schema"] == "rankzoo.claims" and [c["claim"] for c in doc["claims"]] == list(CLAIMS)
    keys = {"claim", "sentence", "source", "quantity", "rule", "thresholds", "verdict",
            "figure", "test", "why", "used", "plot", "data"}
    for c in doc["claims"]:
        assert keys <= set(c)
        expected = REFUTED if c["claim"] == "softmax_bound" else NO_EVIDENCE
        assert c["verdict"] == expected, c


# ---------------------------------------------------------------- softmax bound

def test_softmax_bound_smallest_counterexample_is_the_zero_matrix():
    out = sb.judge(Evidence())
    assert out.verdict == REFUTED and out.data["smallest"]["n"] == 1
    assert out.figure.startswith("M = 0 (1x1)") and "= 1," in out.figure


def test_softmax_bound_low_rank_causal_breaks_past_its_rank():
    M = torch.ones(6, 1, dtype=torch.float64) @ torch.arange(6.0, dtype=torch.float64)[None]
    case = sb.worst_k(M, sb.causal_softmax(M))  # rank 1: sigma_2(M) = 0, P full rank
    assert case["counterexample"] and case["k"] == 2


def test_softmax_bound_full_rank_gives_the_c_it_needs():
    M = torch.eye(4, dtype=torch.float64) * 3
    case = sb.worst_k(M, torch.softmax(M, -1))
    assert not case["counterexample"] and 0 < case["c_needed"] < float("inf")


# ---------------------------------------------------------------- rules on given figures

def _optim(ratios: dict[str, list[float]]) -> Evidence:
    runs = []
    for seed in (0, 1):
        runs.append(run("claims_optimizers", f"adamw_s{seed}", [record(1, [layer(0, 20.0)])],
                        seed, "adamw"))
        for opt, rs in ratios.items():
            runs.append(run("claims_optimizers", f"{opt}_s{seed}",
                            [record(1, [layer(0, 20.0 / rs[seed])])], seed, opt))
    return Evidence(tuple(runs))


def test_optimizer_rule():
    assert optimizers.judge(_optim({"muon": [2.0, 2.1], "lion": [1.5, 1.6]})).verdict == HOLDS
    out = optimizers.judge(_optim({"muon": [0.9, 0.8], "lion": [1.0, 1.02]}))
    assert out.verdict == REFUTED and "muon leaves W_V with the higher rank" in out.why
    out = optimizers.judge(_optim({"muon": [2.0, 1.0], "lion": [1.5, 1.6]}))
    assert out.verdict == PARTLY and "seeds disagree" in out.why
    assert "within seed-to-seed spread" in optimizers.judge(
        _optim({"muon": [1.0, 1.02], "lion": [1.0, 1.01]})).why
    assert optimizers.judge(Evidence()).verdict == NO_EVIDENCE


def test_within_noise_is_said():
    out = optimizers.judge(_optim({"muon": [1.3, 0.8]}))  # adamw 20 vs muon 15.4 and 25
    assert "within seed-to-seed spread" in out.why


def _markov(eranks: dict[int, float]) -> Evidence:
    return Evidence(tuple(run(f"claims_markov_r{r}", "mha", [record(1, [layer(0, e)])],
                              data={"task": "markov", "rank": r}) for r, e in eranks.items()))


def test_data_rank_rule():
    assert data_rank.judge(_markov({2: 2.0, 4: 4.5, 8: 9.0})).verdict == HOLDS
    assert data_rank.judge(_markov({2: 10.0, 4: 20.0, 8: 30.0})).verdict == PARTLY
    assert data_rank.judge(_markov({2: 30.0, 4: 20.0, 8: 25.0})).verdict == REFUTED
    assert data_rank.judge(_markov({2: 2.0, 4: 4.0})).verdict == NO_EVIDENCE  # < 3 ranks


def _lora(losses: dict[int, float], learned=None) -> Evidence:
    return Evidence(tuple(run("claims_lora", f"mha.lora-r{r}", [record(1, [layer(0)])],
                              metrics={"val/loss": v}, learned=learned)
                          for r, v in losses.items()))


def test_lora_rule():  # d_model 64: ln band 4.2-12.5, log2 band 6-18
    assert lora_rank.judge(_lora({1: 3.0, 4: 2.0, 8: 1.0, 16: 1.0})).verdict == HOLDS
    assert lora_rank.judge(_lora({1: 3.0, 8: 2.0, 16: 1.0})).verdict == PARTLY
    out = lora_rank.judge(_lora({1: 1.0, 2: 1.0, 4: 1.0}))
    assert out.verdict == REFUTED and out.data["right"] == 1
    # fine-tunes that all failed their task (report status learned: false) rank nothing
    out = lora_rank.judge(_lora({1: 3.0, 4: 2.0, 8: 1.0}, learned=False))
    assert out.verdict == UNTESTABLE and "no fine-tune learned" in out.figure
    assert lora_rank.judge(_lora({1: 3.0, 4: 2.0, 8: 1.0}, learned=True)).verdict == HOLDS


def _grok(acc, loss, eranks, *more) -> Evidence:
    """Runs of seeds 0, 1, ...: each (accuracy, loss, eranks) over steps."""
    seeds = [(acc, loss, eranks), *more]
    return Evidence(tuple(run("claims_grokking", f"mha_s{i}", [record(s, [layer(0, e)])
                                                               for s, e in r],
                              seed=i, scalars={"val/accuracy": a, "train/loss": lo})
                          for i, (a, lo, r) in enumerate(seeds)))


STEPS = [100 * i for i in range(1, 11)]
SATURATES = [(s, 1.0 if s < 200 else 0.001) for s in STEPS]
LATE = [(s, 0.3 if s < 800 else 0.99) for s in STEPS]
FALLING = [(s, 20.0 - 1.5 * min(i, 7)) for i, s in enumerate(STEPS)]
FLAT = [(s, 10.0) for s in STEPS]


def test_grokking_rule():
    out = grokking.judge(_grok(LATE, SATURATES, FALLING))
    assert out.verdict == PARTLY and "undefined" in out.why
    assert out.data["seeds"]["0"]["grokked"] == 800 and "one seed" in out.used
    assert grokking.judge(_grok(LATE, SATURATES, FLAT)).verdict == REFUTED
    never = [(s, 0.3) for s in STEPS]
    assert grokking.judge(_grok(never, SATURATES, FLAT)).verdict == UNTESTABLE
    at_once = [(s, 0.3 if s < 200 else 0.99) for s in STEPS]  # no delay: not grokking
    out = grokking.judge(_grok(at_once, SATURATES, FALLING))
    assert out.verdict == UNTESTABLE and "no delay" in out.why


def test_grokking_seeds_judged_alone_and_disagreement_said():
    out = grokking.judge(_grok(LATE, SATURATES, FALLING, (LATE, SATURATES, FLAT)))
    assert out.verdict == PARTLY and "the seeds disagree" in out.why
    assert "seed 0: " in out.figure and "seed 1: " in out.figure
    assert set(out.plot["seeds"]) == {"0", "1"} and "one seed" not in out.used
    both = grokking.judge(_grok(LATE, SATURATES, FLAT, (LATE, SATURATES, FLAT)))
    assert both.verdict == REFUTED and "disagree" not in both.why
    never = [(s, 0.3) for s in STEPS]  # a seed that did not grok is said, not counted
    out = grokking.judge(_grok(LATE, SATURATES, FLAT, (never, SATURATES, FLAT)))
    assert out.verdict == REFUTED and "did not grok" in out.why


def _probed(curve: list[float], d_model: int = 64) -> Evidence:
    layers = [layer(i, centered=[v] * 4) for i, v in enumerate(curve)]
    return Evidence(probed=Probed("m", record(0, layers), d_model, 4, 16))


def test_depth_rule():
    assert depth.judge(_probed([8.0, 6.0, 4.0, 3.0])).verdict == PARTLY  # no layer past 8
    assert depth.judge(_probed([4.0, 4.0, 4.0])).verdict == REFUTED
    falling = [40.0 - i for i in range(9)] + [20.0, 19.0, 18.0]  # past 8: 20..18 of 64
    assert depth.judge(_probed(falling)).verdict == HOLDS
    eps_01 = Evidence(probed=Probed("m", record(0, [layer(i) for i in range(4)], 0.1), 64, 4, 16))
    assert depth.judge(eps_01).verdict == NO_EVIDENCE  # the claim's rank is rank_0.01


def test_strict_rank_rests_on_the_diagonal_not_on_fp32_conditioning():
    """A causal softmax P is invertible (positive diagonal) however ill-conditioned: a
    numerical rank below T says so but refutes nothing; only the effective half decides, and
    only softmax layers count (a recurrence's M can be singular)."""
    from train.commands.claims import strict_effective as se

    def judged(centered, numerical, block="softmax"):
        layers = [{**layer(0, centered=centered, numerical=numerical), "block": block}]
        return se.judge(Evidence(probed=Probed("m", record(0, layers), 64, 4, 16)))

    ill = judged([2.0] * 4, [12.0] * 4)  # 12 of 16 values above fp32's floor, low P_c
    assert ill.verdict == HOLDS and "by construction" in ill.figure
    assert ill.data["conditioned_share"] == 0.0 and ill.data["low_share"] == 1.0
    high = judged([12.0] * 4, [16.0] * 4)  # rank_0.01(P_c) 12 of 16 > T/4
    assert high.verdict == PARTLY and "not effectively low" in high.why
    assert judged([2.0] * 4, [16.0] * 4, block="delta").verdict == NO_EVIDENCE


def test_probed_claims_read_the_longest_probe_first():
    short = run("claims_grokking", "mha_s0", [record(1, [layer(0)], seq_len=3)],
                data={"task": "modadd"})
    markov = run("claims_markov_r2", "mha", [record(1, [layer(0)], seq_len=64)],
                 data={"task": "markov"})
    text = run("claims_optimizers", "adamw_s0", [record(1, [layer(0)], seq_len=64)],
               data={"task": "text"})
    lora = run("claims_lora", "mha.lora-r4", [record(1, [layer(0)], seq_len=128)])
    names = [n for n, _, _ in Evidence((short, markov, lora, text)).probes()]
    assert names == ["claims_optimizers/adamw_s0", "claims_markov_r2/mha",
                     "claims_grokking/mha_s0"]  # fine-tunes are not probed models
    probed = Probed("ckpt", record(0, [layer(0)], seq_len=8), 64, 4, 16)
    assert Evidence((text,), probed).probes()[0][0] == "ckpt"


# ---------------------------------------------------------------- runs on disk and the CLI

def _write_run(root: Path, experiment: str, name: str, records: list[dict], config: dict):
    exp = root / experiment
    (exp / name).mkdir(parents=True)
    (exp / "experiment.yaml").write_text(f"name: {experiment}\n")
    (exp / name / "config.yaml").write_text(json.dumps(config))
    (exp / name / "ranks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_runs_read_from_disk_and_cli_json(tmp_path, capsys):
    for r, e in {2: 30.0, 4: 20.0, 8: 25.0}.items():
        _write_run(tmp_path, f"claims_markov_r{r}", "mha", [record(1, [layer(0, e)])],
                   {"seed": 0, "data": {"task": "markov", "rank": r}, "model": {"d_model": 64}})
    assert len(read_runs(tmp_path).runs) == 3
    assert main(["claims", str(tmp_path), "--claim", "data_rank", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (c,) = doc["claims"]
    assert c["claim"] == "data_rank" and c["verdict"] == REFUTED
    assert main(["claims", str(tmp_path), "--plot", str(tmp_path / "plots")]) == 0
    assert "data_rank" in capsys.readouterr().out
    assert (tmp_path / "plots" / "claim_data_rank.png").is_file()


@pytest.mark.parametrize("argv, says", [
    (["claims", "--claim", "nope"], "unknown claim 'nope'"),
    (["claims", "/nonexistent/runs"], "/nonexistent/runs not found"),
])
def test_cli_errors_name_the_input(capsys, argv, says):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_cli_flag_pairs(capsys):
    with pytest.raises(SystemExit):
        main(["claims", "--hf", "somewhere"])
    assert "--hf MODEL and --text FILE go together" in capsys.readouterr().err


def test_list_and_the_shipped_plan(capsys):
    assert main(["claims", "--list", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["claim"] for c in listed["claims"]] == list(CLAIMS)
    plan = read_plan(ROOT / "configs" / "claims" / "plan.yaml")
    assert len(plan) == 7
    names = {load_experiment(p.config, list(p.overrides)).name for p in plan}
    assert names == {"claims_optimizers", "claims_lora", "claims_grokking",
                     *(f"claims_markov_r{r}" for r in (2, 4, 8, 16))}


def test_plan_rejects_unknown_keys(tmp_path):
    bad = tmp_path / "plan.yaml"
    bad.write_text("experiment: []\n")
    with pytest.raises(ValueError, match="`experiments`"):
        read_plan(bad)


def test_grokking_figure_draws_every_seed(tmp_path):
    from train.render.claims import write_claims_plots

    doc = claims_document(_grok(LATE, SATURATES, FALLING, (LATE, SATURATES, FLAT)), ["grokking"])
    (path,) = write_claims_plots(doc, tmp_path)
    assert path.name == "claim_grokking.png" and path.stat().st_size > 0


def test_optimizer_figure_draws_erank_srank_and_rank_eps(tmp_path):
    from train.render.claims import write_claims_plots

    doc = claims_document(_optim({"muon": [2.0, 2.1], "lion": [1.5, 1.6]}), ["optimizers"])
    assert set(doc["claims"][0]["plot"]["values"]["muon"]["0"]) == {"erank", "stable_rank",
                                                                     "rank_eps"}
    (path,) = write_claims_plots(doc, tmp_path)
    assert path.name == "claim_optimizers.png" and path.stat().st_size > 0


def test_train_says_the_plans_wall_time(tmp_path, capsys, monkeypatch):
    import train.commands.claims.plan as plan_module

    for r, e in {2: 30.0, 4: 20.0, 8: 25.0}.items():
        _write_run(tmp_path, f"claims_markov_r{r}", "mha", [record(1, [layer(0, e)])],
                   {"seed": 0, "data": {"task": "markov", "rank": r}, "model": {"d_model": 64}})
    trained = []
    monkeypatch.setattr(plan_module, "train_plan",
                        lambda plan, runs: trained.append((plan, runs)) or 90.0)
    assert main(["claims", str(tmp_path), "--train", "plan.yaml", "--claim", "data_rank"]) == 0
    assert trained == [("plan.yaml", str(tmp_path))]
    assert "in 1.5 min" in capsys.readouterr().err


def test_only_layers_whose_mixing_keeps_its_diagonal_count_as_softmax():
    """A causal softmax is invertible by its positive diagonal; DSA's top-k need not keep
    a query's own key, so its layers are not read as one."""
    from train.commands.claims.strict_effective import is_softmax

    def layer(**kind):
        return {"kind": {"attention": "global", **kind}}

    assert is_softmax(layer()) and is_softmax(layer(attention="chunked"))
    assert not is_softmax(layer(topk=8)) and not is_softmax(layer(attention="ssm"))
