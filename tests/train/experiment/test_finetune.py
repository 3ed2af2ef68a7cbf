"""The LoRA stage: LoRALinear, attach_lora on every zoo block, the finetune config section,
and a fine-tune of a tiny trained model that changes the adapters and nothing else."""

import copy
import json

import pytest
import torch
import yaml
from rich.console import Console
from torch import nn

import budgets
import zoo
from tests.train.conftest import tiny_experiment
from train.config import parse_experiment
from train.experiment.finetune import finetune_variant, lora_name
from train.experiment.stages import train_experiment
from train.harness.module import build_model
from train.harness.optim import build_optimizer
from train.lm.lora import LoRALinear, attach_lora

DATA = {**tiny_experiment()["data"], "train_size": 64, "val_size": 16, "batch_size": 16}
BASE = tiny_experiment(
    name="ft", data=DATA, model={"d_model": 32},
    train={"max_steps": 4, "val_every_n_steps": 4, "checkpoint_every_n_steps": 4},
    monitor={"every_n_steps": 4},
    finetune={"ranks": [1, 2], "targets": ["q_proj", "v_proj"],
              "data": {**DATA, "permute_seed": 1},
              "train": {"max_steps": 4, "lr": 0.02, "warmup_steps": 0}})
QUIET = Console(quiet=True)


def raw_with(**finetune):
    raw = copy.deepcopy(BASE)
    raw["finetune"].update(finetune)
    return raw


# ---------------------------------------------------------------- LoRALinear, attach_lora

def test_lora_linear_is_base_plus_scaled_low_rank_update():
    torch.manual_seed(0)
    base = nn.Linear(8, 6)
    lin = LoRALinear(base, r=3, alpha=6.0)
    x = torch.randn(4, 5, 8)
    assert torch.equal(lin(x), base(x))  # B = 0: the adapted layer starts as the base
    nn.init.normal_(lin.lora_B)
    want = base(x) + 2.0 * x @ lin.lora_A.T @ lin.lora_B.T
    torch.testing.assert_close(lin(x), want)
    torch.testing.assert_close(nn.functional.linear(x, lin.weight, lin.bias), want)
    assert lin.scaling == 2.0 and lin.lora_A.shape == (3, 8) and lin.lora_B.shape == (6, 3)
    assert not any(p.requires_grad for p in base.parameters())
    (row,) = budgets.adapter_ranks(nn.Sequential(lin))
    assert row["declared"] == 3 and row["metrics"]["numerical_rank"] <= 3


def adapter_parameters(model: nn.Module, names: list[str]) -> list[nn.Parameter]:
    """A and B of each module attach_lora adapted, by the names it returned."""
    return [p for n in names for p in (model.get_submodule(n).lora_A,
                                       model.get_submodule(n).lora_B)]


def test_attach_lora_freezes_everything_but_adapters_and_names_unmatched_targets():
    model = build_model(parse_experiment(BASE).variant_config("mha"))
    names = attach_lora(model, ["q_proj", "mixer.v_proj"], r=2, alpha=2.0)
    assert names == ["layers.0.mixer.q_proj", "layers.0.mixer.v_proj"]
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in adapter_parameters(model, names)}
    with pytest.raises(ValueError, match=r"\['in_proj'\].*Linear names: .*'q_proj'"):
        attach_lora(build_model(parse_experiment(BASE).variant_config("mha")),
                    ["q_proj", "in_proj"], r=2, alpha=2.0)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_optimizer_gets_only_the_adapters(optimizer):
    model = build_model(parse_experiment(BASE).variant_config("mha"))
    names = attach_lora(model, ["q_proj", "v_proj", "o_proj"], r=2, alpha=2.0)
    opt = build_optimizer(model, {"optimizer": optimizer, "lr": 1e-3, "weight_decay": 0.0,
                                  "beta1": 0.9, "beta2": 0.98})
    got = {id(p) for g in opt.param_groups for p in g["params"]}
    assert got == {id(p) for p in adapter_parameters(model, names)}


BLOCKS = [("softmax", {}), ("sliding_window", {"window": 4}), ("linear", {}),
          ("ssm", {"d_state": 8}), ("mla", {"kv_lora_rank": 8, "q_lora_rank": 8}),
          ("moe", {"top_k": 1})]


@pytest.mark.parametrize("name,kwargs", BLOCKS)
def test_adapted_block_applies_the_adapter_on_every_path(name, kwargs):
    """Blocks read `proj.weight` (F.linear, MLA's absorbed decoding): the adapted block must
    equal a plain block holding the merged weights, in parallel and cached forwards."""
    torch.manual_seed(0)
    block = zoo.build(name, d_model=32, n_heads=2, **kwargs).double()
    ref, plain = copy.deepcopy(block), copy.deepcopy(block)
    linears = [n for n, m in block.named_modules() if isinstance(m, nn.Linear)]
    names = attach_lora(block, linears, r=2, alpha=4.0)
    with torch.no_grad():
        for p in adapter_parameters(block, names):
            p.normal_()
        for n in linears:
            ref.get_submodule(n).weight.copy_(block.get_submodule(n).weight)
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    torch.testing.assert_close(block(x), ref(x))
    assert not torch.allclose(block(x), plain(x))  # the adapter is not a no-op
    cache, ref_cache = block.init_cache(2, 8), ref.init_cache(2, 8)
    block(x[:, :7], cache=cache), ref(x[:, :7], cache=ref_cache)
    torch.testing.assert_close(block(x[:, 7:], cache=cache), ref(x[:, 7:], cache=ref_cache))
    block(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for p in adapter_parameters(block, names))


# ---------------------------------------------------------------- config

def test_finetune_section_round_trips():
    exp = parse_experiment(BASE)
    assert exp.finetune.ranks == [1, 2] and exp.finetune.data.permute_seed == 1
    assert parse_experiment(exp.to_dict()) == exp
    assert "finetune" not in parse_experiment({k: v for k, v in BASE.items()
                                               if k != "finetune"}).to_dict()


@pytest.mark.parametrize("finetune,match", [
    ({"rank": [1]}, r"unknown experiment key 'finetune.rank'; did you mean 'finetune.ranks'"),
    ({"ranks": [0, 2]}, r"finetune.ranks must be .*>= 1, got \[0, 2\]"),
    ({"ranks": []}, r"finetune.ranks"),
    ({"from_variants": ["gqa"]}, r"finetune.from_variants \['gqa'\] .*variants.*\['mha'\]"),
    ({"data": {**DATA, "vocab_size": 64}},
     r"finetune.data.vocab_size \(64\) exceeds .*data.vocab_size 32"),
    ({"data": {**DATA, "bogus": 1}}, r"finetune.*data.bogus"),
    ({"train": {"lr": -1.0}}, r"finetune.train.lr must be > 0"),
    ({"targets": ["in_proj"]}, r"finetune.targets \['in_proj'\] .*'mha'.*q_proj"),
    ({"alpha": 0}, r"finetune.alpha must be a number > 0"),
])
def test_finetune_config_errors(finetune, match):
    with pytest.raises(ValueError, match=match):
        parse_experiment(raw_with(**finetune))


def test_missing_checkpoint_is_named(tmp_path):
    exp = parse_experiment(BASE)
    with pytest.raises(FileNotFoundError, match=r"mha.lora-r1: .*mha/checkpoints/last.ckpt"):
        finetune_variant(exp, "mha", 1, tmp_path / "ft", QUIET)


# ---------------------------------------------------------------- a real fine-tune

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    exp = parse_experiment(BASE)
    report = train_experiment(exp, runs_dir=runs, console=QUIET)
    return exp, runs / "ft", report


def _state(path):
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.parametrize("r", [1, 2])
def test_finetune_changes_only_the_adapters(run, r):
    _, exp_dir, _ = run
    base = _state(exp_dir / "mha" / "checkpoints" / "last.ckpt")
    tuned = _state(exp_dir / lora_name("mha", r) / "checkpoints" / "last.ckpt")
    frozen = {k.replace(".base.", "."): v for k, v in tuned.items() if "lora_" not in k}
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[k], base[k]) for k in base)  # bit for bit
    lora_b = [v for k, v in tuned.items() if k.endswith("lora_B")]
    assert len(lora_b) == 2 and all(v.abs().sum() > 0 for v in lora_b)  # B started at 0
    assert all(v.shape[1] == r for v in lora_b)


def test_realized_adapter_rank_is_capped_by_r_and_reported(run):
    exp, exp_dir, report = run
    for r in (1, 2):
        vdir = exp_dir / lora_name("mha", r)
        record = json.loads((vdir / "ranks.jsonl").read_text().splitlines()[-1])
        adapters = [a for layer in record["layers"] for a in layer["adapters"]]
        assert len(adapters) == 2
        assert all(a["declared"] == r and a["metrics"]["numerical_rank"] <= r for a in adapters)
        rows = [row for layer in budgets.load_report(vdir / "report.json")["variants"][0]["layers"]
                for row in layer["axes"] if row["axis"] == "adapter"]
        assert len(rows) == 2 and all(row["declared"] == r for row in rows)
        config = yaml.safe_load((vdir / "config.yaml").read_text())
        assert config["finetune"]["r"] == r and config["finetune"]["base_variant"] == "mha"
        assert config["finetune"]["base_checkpoint"].endswith("mha/checkpoints/last.ckpt")
    assert [v["variant"] for v in report["variants"]] == ["mha", "mha.lora-r1", "mha.lora-r2"]
    summary = json.loads((exp_dir / "finetune.json").read_text())
    rows = summary["variants"]["mha"]
    assert [row["r"] for row in rows] == [1, 2]
    assert all(row["numerical_rank_max"] <= row["r"] for row in rows)
    assert all("val/accuracy" in row["metrics"] for row in rows)


def test_finetune_never_overwrites_and_resume_skips_finished(run):
    exp, exp_dir, _ = run
    with pytest.raises(FileExistsError, match=r"mha.lora-r1 already exists"):
        finetune_variant(exp, "mha", 1, exp_dir, QUIET)
    before = (exp_dir / "mha.lora-r1" / "report.json").read_text()
    entry = finetune_variant(exp, "mha", 1, exp_dir, QUIET, resume=True)
    assert entry["step"] == 4
    assert (exp_dir / "mha.lora-r1" / "report.json").read_text() == before
    # a finished fine-tune of another task is not this one's result: refused, untouched
    changed = parse_experiment(raw_with(data={**DATA, "permute_seed": 7}))
    with pytest.raises(FileExistsError, match=r"different data section"):
        finetune_variant(changed, "mha", 1, exp_dir, QUIET, resume=True)
    assert (exp_dir / "mha.lora-r1" / "report.json").read_text() == before


def test_after_a_sweep_the_fine_tune_starts_from_the_best_run(tmp_path):
    raw = raw_with(ranks=[1])
    # 1e4 diverges; of the two finite lrs, the sweep's summary picks the winner
    raw["sweep"] = {"lr": [1e-5, 1e-2, 1e4]}
    exp = parse_experiment(raw)
    report = train_experiment(exp, runs_dir=tmp_path, console=QUIET)
    assert "mha.lora-r1" in [v["variant"] for v in report["variants"]]
    sweep = json.loads((tmp_path / "ft" / "sweep.json").read_text())
    (group,) = sweep["groups"]
    losses = {e["lr"]: e["mean"] for e in group["lrs"]}
    assert losses[1e4] is None and group["best_lr"] == min((1e-5, 1e-2), key=losses.get)
    config = yaml.safe_load((tmp_path / "ft" / "mha.lora-r1" / "config.yaml").read_text())
    best_run = {1e-5: "mha_lr1e-05", 1e-2: "mha_lr0.01"}[group["best_lr"]]
    assert f"/{best_run}/" in config["finetune"]["base_checkpoint"]
    assert [r for e in group["lrs"] for r in e["runs"]] == [
        "mha_lr1e-05", "mha_lr0.01", "mha_lr10000"]  # the fine-tune is not a run of the sweep


def test_a_sweep_fine_tune_names_configured_variants():
    raw = raw_with(from_variants=["mha_lr0.001"])
    raw["sweep"] = {"lr": [1e-3]}
    with pytest.raises(ValueError, match=r"not variants of this experiment: \['mha'\]"):
        parse_experiment(raw)
