"""`rankzoo export`: a trained variant of every block family and two layer patterns as a
Hugging Face model directory, loaded back through AutoModelForCausalLM after `import zoo`:
its logits are the DecoderLM's, generate() through the blocks' own caches equals
generate() without one token for token, a left-padded batch equals its rows alone, and
lm-eval's accuracy on a local multiple-choice task equals the one its log-probabilities
give. The runs are written without training (a seeded random model as the checkpoint)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import budgets
import zoo  # noqa: F401  (the Auto classes learn model_type "rankzoo")
from tests.train.conftest import tiny_experiment, write_run
from train.cli import main
from train.config import parse_experiment
from train.hf.export import export_variant, trained_lm
from train.lm.decoder import build_model

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "softmax": {"block": "softmax", "n_kv_heads": 1},
    "sliding_window": {"block": "sliding_window", "window": 4},
    "mla": {"block": "mla", "kv_lora_rank": 4},
    "moe": {"block": "moe"},
    "linear": {"block": "linear", "feature_dim": 4},
    "ssm": {"block": "ssm", "d_state": 4},
    "delta": {"block": "delta", "gate": "scalar"},
    "sparse": {"block": "sparse", "top_k": 4},  # DSA's selection, biting at T = 8 and past
    "local_global": {"pattern": ["local", "global"], "blocks": {
        "local": {"block": "sliding_window", "window": 4}, "global": {"block": "mla"}}},
    "ssm_attention": {"layers": [{"block": "ssm", "d_state": 4}, {"block": "softmax"}]},
}
VOCAB, MAX_LEN, NEW = 32, 64, 40


def save_checkpoint(vdir: Path, config: dict, seed: int = 0) -> None:
    """checkpoints/last.ckpt as the harness lays it out, a seeded random DecoderLM's."""
    torch.manual_seed(seed)
    model = build_model(config)
    (vdir / "checkpoints").mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                "global_step": 6, "hyper_parameters": {"config": config}},
               vdir / "checkpoints" / "last.ckpt")


def make_run(root: Path, raw: dict) -> Path:
    exp_dir = write_run(root, raw)
    exp = parse_experiment(raw)
    for name in exp.variants:
        save_checkpoint(exp_dir / name, exp.variant_config(name))
    return exp_dir


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """variant -> (its run directory, its exported model directory)."""
    root = tmp_path_factory.mktemp("export")
    exp_dir = make_run(root, tiny_experiment(model={"d_model": 16, "n_layers": 2},
                                             variants=VARIANTS))
    return {name: (exp_dir / name, Path(export_variant(exp_dir / name, root / "hf" / name,
                                                       max_len=MAX_LEN)["out"]))
            for name in VARIANTS}


def load(model_dir: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


def greedy(model, ids, mask=None, use_cache=True, new=NEW):
    mask = torch.ones_like(ids) if mask is None else mask  # pads only where the mask says
    return model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                          use_cache=use_cache, pad_token_id=0)


def test_the_directory_is_a_rankzoo_model(exported):
    _, model_dir = exported["ssm_attention"]
    config = transformers.AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "rankzoo" and type(config).__name__ == "RankzooConfig"
    assert [s["name"] for s in config.layers] == ["ssm", "softmax"]
    assert {p.name for p in model_dir.iterdir()} == {
        "config.json", "model.safetensors", "generation_config.json"}


@pytest.mark.parametrize("name", VARIANTS)
def test_logits_equal_the_trained_models(exported, name):
    vdir, model_dir = exported[name]
    model, (lm, _, _) = load(model_dir), trained_lm(vdir)
    assert type(model).__name__ == "RankzooForCausalLM"
    tokens = torch.randint(0, VOCAB, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(tokens).logits, lm(tokens)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_generation_equals_uncached(exported, name):
    model = load(exported[name][1])
    prompt = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cached, uncached = greedy(model, prompt), greedy(model, prompt, use_cache=False)
    assert cached.shape == (2, 8 + NEW)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("name", VARIANTS)
def test_a_left_padded_batch_equals_its_rows_alone(exported, name):
    model = load(exported[name][1])
    g = torch.Generator().manual_seed(3)
    long, short = torch.randint(1, VOCAB, (8,), generator=g), torch.randint(1, VOCAB, (5,),
                                                                            generator=g)
    batch = torch.stack([long, torch.cat([torch.zeros(3, dtype=torch.long), short])])
    mask = torch.ones_like(batch)
    mask[1, :3] = 0
    with torch.no_grad():
        padded = greedy(model, batch, mask, new=12)
        alone = [greedy(model, long[None], new=12)[0], greedy(model, short[None], new=12)[0]]
        logits = model(batch, attention_mask=mask).logits
    assert torch.equal(padded[0], alone[0])
    assert torch.equal(padded[1, 3:], alone[1])
    torch.testing.assert_close(logits[1, 3:], model(short[None]).logits[0], rtol=1e-5,
                               atol=1e-6)


def test_the_former_cache_name_is_taken(exported):
    model = load(exported["delta"][1])
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        first = model(tokens[:, :5], use_cache=True)
        step = model(tokens[:, 5:], past_key_values=first.cache, use_cache=True).logits
        whole = model(tokens).logits
    torch.testing.assert_close(step[0, -1], whole[0, -1], rtol=1e-5, atol=1e-6)


def test_a_non_empty_out_is_refused(exported, tmp_path, capsys):
    vdir, _ = exported["softmax"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["export", str(vdir), "--out", str(tmp_path / "taken")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]
    assert main(["export", str(vdir), "--out", str(tmp_path / "new"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layers"] == ["softmax", "softmax"] and (tmp_path / "new" / "config.json").is_file()


# ---------------------------------------------------------------- lm-eval

WORDS = "the cat dog sat on a mat log is red blue green what color sky grass sun yellow"
ROWS = [("what color is the sky", ["blue", "red", "green"], 0),
        ("what color is the grass", ["red", "green", "yellow"], 1),
        ("what color is the sun", ["blue", "green", "yellow"], 2),
        ("the cat sat on a", ["mat", "log", "dog"], 0),
        ("the dog sat on a", ["cat", "log", "sun"], 1),
        ("what is red", ["the sun", "the sky", "a log"], 0)]


def word_tokenizer(path: Path) -> Path:
    """A model directory's word-level tokenizer: tokenizer.json and its config (pad, unk)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS.split()])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "[PAD]",
        "unk_token": "[UNK]"}))
    return path


def task_dir(path: Path) -> Path:
    path.mkdir()
    data = path / "mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n"
                            for q, c, a in ROWS))
    (path / "tiny_mc.yaml").write_text(
        f"task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n')
    return path


def own_accuracy(model, tokenizer) -> float:
    """Each question's choice of highest summed log-probability, as lm-eval's acc counts."""
    right = 0
    for question, choices, answer in ROWS:
        context = tokenizer.encode(question, add_special_tokens=False)
        scores = []
        for choice in choices:
            cont = tokenizer.encode(choice, add_special_tokens=False)
            ids = torch.tensor([context + cont])
            with torch.no_grad():
                logp = model(ids).logits[0, :-1].log_softmax(-1)  # [T - 1, vocab]
            scores.append(sum(logp[len(context) - 1 + i, t].item() for i, t in enumerate(cont)))
        right += int(max(range(len(choices)), key=scores.__getitem__) == answer)
    return right / len(ROWS)


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                    reason="lm-evaluation-harness is not installed (pip install "
                           "'rankzoo[eval]', or the dev extra)")
def test_lm_eval_accuracy_equals_the_models_own_log_probs(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(WORDS.split() * 20))
    tok = word_tokenizer(tmp_path / "tok")
    raw = tiny_experiment(data={"task": "text", "paths": [str(text)], "tokenizer": str(tok),
                                "vocab_size": None, "num_kv_pairs": None},
                          model={"d_model": 16, "n_layers": 2},
                          variants={"mha": None, "hybrid": VARIANTS["ssm_attention"]})
    vdir = make_run(tmp_path / "runs", raw) / "hybrid"
    model_dir = Path(export_variant(vdir, tmp_path / "hf", max_len=MAX_LEN)["out"])
    assert (model_dir / "tokenizer.json").is_file()
    tasks = task_dir(tmp_path / "tasks")
    assert main(["eval", str(vdir), "--tasks", "tiny_mc", "--include", str(tasks),
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    acc = doc["tasks"]["tiny_mc"]["acc"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert acc == pytest.approx(own_accuracy(load(model_dir), tokenizer), abs=1e-9)
    assert json.loads((vdir / "eval.json").read_text())["tasks"]["tiny_mc"]["acc"] == acc
    assert main(["report", str(vdir.parent), "--format", "json"]) == 0  # beside the ranks
    (variant,) = json.loads(capsys.readouterr().out)["variants"]
    assert variant["lm_eval"]["tiny_mc"]["acc"] == acc and variant["layers"]


# ---------------------------------------------------------------- report --hf

def figures(layer: dict) -> dict:
    """A report layer's figures: every axis's declared and realized ranks, the centered
    eranks (the --hf report adds per-head eranks the run's does not keep)."""
    return {"axes": [{k: a[k] for k in ("quantity", "declared", "realized_mean", "per_head")}
                     for a in layer["axes"]],
            **{k: v for k, v in layer.items() if k.endswith("_erank")}}


def test_report_hf_reads_every_layer_as_the_runs_report(tmp_path, capsys):
    raw = tiny_experiment(model={"d_model": 16, "n_layers": 2},
                          variants={"mha": None, "hybrid": VARIANTS["ssm_attention"]})
    exp_dir = make_run(tmp_path / "runs", raw)
    vdir = exp_dir / "hybrid"
    lm, _, _ = trained_lm(vdir)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(5))
    # the run's report on these tokens, as training records its probe of the checkpoint
    probe = budgets.probe_model(lm, tokens, eps=0.1)
    entry = {"probe": probe, "step": 6, "params": lm.param_count(), "metrics": {}}
    (vdir / "ranks.jsonl").write_text(json.dumps({"step": 6, **probe}) + "\n")
    (vdir / "report.json").write_text(budgets.to_json(budgets.build_report(
        {"hybrid": entry}, experiment="tiny")) + "\n")
    model_dir = export_variant(vdir, tmp_path / "hf")["out"]
    text = tmp_path / "tokens.txt"  # bytes whose values modulo the vocabulary are the tokens
    text.write_bytes(bytes((64 + tokens.flatten()).tolist()))
    assert main(["report", str(exp_dir), "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["variants"]
    assert main(["report", "--hf", model_dir, "--text", str(text), "--seq-len", "16",
                 "--probe-size", "2", "--no-bos", "--format", "json"]) == 0
    (hf,) = json.loads(capsys.readouterr().out)["variants"]
    assert len(hf["layers"]) == 2 and [ly["block"] for ly in hf["layers"]] == ["ssm", "softmax"]
    assert [figures(ly) for ly in hf["layers"]] == [figures(ly) for ly in run["layers"]]


def test_report_shows_the_scores_rankzoo_eval_kept(tmp_path, capsys):
    exp_dir = write_run(tmp_path, tiny_experiment(variants={"mqa": {"block": "softmax",
                                                                    "n_kv_heads": 1}}))
    (exp_dir / "mqa" / "eval.json").write_text(json.dumps(
        {"schema": "rankzoo.eval", "tasks": {"tiny_mc": {"acc": 0.5, "acc_norm": 0.25}}}))
    assert main(["report", str(exp_dir), "--format", "json"]) == 0
    variants = {v["variant"]: v for v in json.loads(capsys.readouterr().out)["variants"]}
    assert variants["mqa"]["lm_eval"] == {"tiny_mc": {"acc": 0.5, "acc_norm": 0.25}}
    assert "lm_eval" not in variants["mha"]
    assert main(["report", str(exp_dir)]) == 0
    out = capsys.readouterr().out
    assert "lm-eval" in out and "tiny_mc" in out and "0.25" in out
    (exp_dir / "mqa" / "eval.json").write_text(json.dumps({"tasks": {"tiny_mc": "high"}}))
    assert main(["report", str(exp_dir)]) == 2
    assert "not a rankzoo eval document" in capsys.readouterr().err
