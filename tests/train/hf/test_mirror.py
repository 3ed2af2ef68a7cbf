"""`rankzoo report --hf MODEL_DIR --text FILE --emit FILE`: a checkpoint's layer pattern
mirrored as a zoo experiment (train/commands/mirror/), on tiny random models built offline.

Each model is saved and probed once (module fixtures); the mirroring itself is read from
the probe's entry, and the CLI is run for what only it does: the flags, the refusals before
the probe, the file written and dry-run by `rankzoo train`.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers",
                    reason="rankzoo report --hf needs transformers (pip install 'rankzoo[hf]')")

from tests.hf_tiny import tiny_model  # noqa: E402
from train.cli import main  # noqa: E402
from train.commands.mirror.emit import (  # noqa: E402
    MirrorSizes,
    mirror_experiment,
    mirrored_block,
    nearest_divisor,
)
from train.commands.mirror.pattern import decoder_kinds, ranges, unit_length  # noqa: E402
from train.config.load import load_experiment  # noqa: E402
from train.hf import probe_hf  # noqa: E402

T, P = 32, 1  # probe length and size: 32 tokens of text
SIZES = MirrorSizes(d_model=64, n_heads=4, seq_len=T)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    g = torch.Generator().manual_seed(0)
    path.write_text(" ".join(str(i) for i in torch.randint(100, (200,), generator=g).tolist()))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """model key -> its saved directory, each built once; key: a tiny model type, or
    `type:n` for one with n layers."""
    root, dirs = tmp_path_factory.mktemp("hf"), {}

    def get(key: str):
        if key not in dirs:
            model_type, _, n = key.partition(":")
            extra = {"num_hidden_layers": int(n)} if n else {}
            dirs[key] = root / key.replace(":", "_")
            tiny_model(model_type, **extra).save_pretrained(dirs[key])
        return dirs[key]
    return get


@pytest.fixture(scope="module")
def entry(saved, text_file):
    """model key -> probe_hf's entry for it, each probed once."""
    entries = {}

    def get(key: str):
        if key not in entries:
            entries[key] = probe_hf(saved(key), text_file, seq_len=T, probe_size=P)[1]
        return entries[key]
    return get


def _cli(capsys, model_dir, text_file, *flags):
    code = main(["report", "--hf", str(model_dir), "--text", str(text_file), "--seq-len",
                 str(T), "--probe-size", str(P), "--device", "cpu", *map(str, flags)])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- the pattern

def test_gemma3_is_five_windows_to_one_global(entry):
    m = mirror_experiment(entry("gemma3_text"), SIZES, "g3")
    variants = m.raw["variants"]
    assert list(variants) == ["pattern", "local", "global"]  # equal parameters: in order
    assert variants["pattern"]["pattern"] == ["local"] * 5 + ["global"]
    # W kept (8 < T); the checkpoint's 1 KV head of 4 query heads is 1 of --n-heads 4
    local = {"block": "sliding_window", "window": 8, "n_kv_heads": 1}
    assert variants["pattern"]["blocks"] == {"local": local,
                                             "global": {"block": "softmax", "n_kv_heads": 1}}
    assert variants["local"] == local and variants["global"]["block"] == "softmax"
    assert m.raw["model"]["n_layers"] == 6 and m.raw["match"]["params"] is True
    assert m.raw["data"]["seq_len"] == T and m.notes == []


def test_gpt_oss_alternates_and_says_what_is_not_mirrored(entry):
    m = mirror_experiment(entry("gpt_oss"), MirrorSizes(64, 4, T, n_layers=6), "oss")
    assert m.raw["variants"]["pattern"]["pattern"] == ["local", "global"]
    assert m.raw["model"]["n_layers"] == 6  # three units
    assert m.raw["variants"]["pattern"]["blocks"]["local"]["window"] == 8
    # its sinks are softmax's option; its experts (after the mixer) no zoo knob says
    assert all(b["sinks"] is True for b in m.raw["variants"]["pattern"]["blocks"].values())
    assert any("experts" in n for n in m.notes)
    assert not any("sinks" in n for n in m.notes)


@pytest.mark.parametrize("key", ["deepseek_v32", "glm_moe_dsa"])
def test_dsa_layers_are_the_sparse_familys_token_selection(entry, key):
    m = mirror_experiment(entry(key), SIZES, "dsa")
    spec = m.raw["variants"]["dsa"]
    assert spec == {"block": "sparse", "selection": "token", "top_k": 8, "n_kv_heads": 1}
    assert not any("would select" in n for n in m.notes)  # k = 8 bites at T = 32: kept
    short = mirror_experiment(entry(key), MirrorSizes(64, 4, 16), "dsa")
    assert short.raw["variants"]["dsa"]["top_k"] == 4  # 8 would select half of 16 keys
    assert any("top-k 8 would select" in n and "top_k=4" in n for n in short.notes)


def test_bamba_is_its_ssm_then_attention(entry):
    m = mirror_experiment(entry("bamba"), SIZES, "bamba")
    pattern = m.raw["variants"]["pattern"]
    assert pattern["pattern"] == ["ssm", "global"]  # attention at layer 1
    assert pattern["blocks"]["ssm"] == {"block": "ssm", "d_state": 16, "n_groups": 1}
    assert set(m.raw["variants"]) == {"pattern", "ssm", "global"}
    # the SSM layer has more parameters than the attention layer: every layer an SSM first,
    # so that matching widens the others' MLPs
    assert list(m.raw["variants"])[0] == "ssm"


def test_llama_is_uniform_and_said_so(entry):
    m = mirror_experiment(entry("llama"), MirrorSizes(64, 4, T, window=4), "llama")
    assert m.raw["variants"] == {"global": {"block": "softmax", "n_kv_heads": 2}}
    assert any("not a hybrid" in n for n in m.notes)
    assert any("--window 4: llama has no sliding layers; ignored" in n for n in m.notes)


def test_a_last_unit_cut_short_rounds_to_whole_units(entry):
    # 8 layers of Gemma 3's 5:1 are one unit of 6 and 2 more (as 1B's 26 are 4 and 2)
    m = mirror_experiment(entry("gemma3_text:8"), SIZES, "g3")
    assert m.raw["variants"]["pattern"]["pattern"] == ["local"] * 5 + ["global"]
    assert m.raw["model"]["n_layers"] == 6
    assert any("8 layers are 1 unit of 6" in n and "--n-layers" in n for n in m.notes)


def test_unit_lengths_and_layer_ranges():
    assert unit_length(["a"] * 4) == 1
    assert unit_length(["a", "b"] * 3) == 2
    assert unit_length(["s"] * 5 + ["g"] + ["s"] * 2) == 6  # the last repeat cut short
    assert unit_length(["s", "g", "g"]) == 3  # no unit repeats: the whole layout
    assert ranges([2, 3, 4, 7]) == "2-4, 7"


def test_kv_heads_keep_the_checkpoints_share(entry):
    g3 = decoder_kinds(entry("gemma3_text"))[5]  # global, 1 KV head of 4
    assert mirrored_block(g3, MirrorSizes(64, 8, T), "g")[0]["n_kv_heads"] == 2  # 2 of 8
    llama = decoder_kinds(entry("llama"))[0]  # 2 of 4: half of one head is none
    spec, _, notes = mirrored_block(llama, MirrorSizes(64, 1, T), "llama")
    assert spec["n_kv_heads"] == 1 and "no whole share of --n-heads 1" in notes[0]
    assert nearest_divisor(12, 2.5) == 3 and nearest_divisor(8, 0.25) == 1


def test_ssm_state_is_capped_at_what_d_model_allows(entry):
    ssm = decoder_kinds(entry("bamba"))[0]  # N = 16
    spec, _, notes = mirrored_block(ssm, MirrorSizes(d_model=2, n_heads=1, seq_len=T), "b")
    assert spec["d_state"] == 8  # the zoo's ssm sizes N up to 4 x d_model
    assert "N=16" in notes[0] and "--d-model 2" in notes[0]


def test_a_window_not_below_the_length_is_refused_naming_it(entry):
    with pytest.raises(ValueError, match=r"W=8 .*--train-seq-len 8.*--window"):
        mirror_experiment(entry("gemma3_text"), MirrorSizes(64, 4, 8), "g3")
    m = mirror_experiment(entry("gemma3_text"), MirrorSizes(64, 4, 8, window=4), "g3")
    assert m.raw["variants"]["local"]["window"] == 4


@pytest.mark.parametrize("key, match", [
    ("lfm2", r"layers 0, 2 \('short conv L=3'\) are of a kind no zoo block mirrors"),
    ("falcon_h1", r"decoder layer 0 mixes by 2 mixers"),  # attention beside its SSM
])
def test_what_a_zoo_layer_cannot_be_is_refused(entry, key, match):
    with pytest.raises(ValueError, match=match):
        mirror_experiment(entry(key), SIZES, key)


def test_a_mixer_the_probe_did_not_read_is_refused(entry):
    unread = {**entry("lfm2")}  # as if no capture had read lfm2's short convolutions
    unread["probe"] = {**unread["probe"], "unmeasured_mixers": [
        {"model_type": "lfm2", "layer": i, "name": f"model.layers.{i}.conv",
         "class": "Lfm2ShortConv"} for i in (0, 2)]}
    with pytest.raises(ValueError, match=r"did not measure lfm2's layers 0, 2 \(Lfm2ShortConv\)"):
        mirror_experiment(unread, SIZES, "lfm2")


# ---------------------------------------------------------------- the CLI

@pytest.mark.parametrize("key", ["gemma3_text", "bamba"])
def test_the_emitted_file_loads_and_dry_runs(capsys, saved, text_file, tmp_path, key):
    path = tmp_path / "mirror.yaml"
    code, out, err = _cli(capsys, saved(key), text_file, "--emit", path, "--d-model", 64,
                          "--n-heads", 4, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["schema"] == "rankzoo.report"  # stdout: the report alone
    assert f"wrote {path}: " in err
    assert path.read_text().startswith(
        f"# Written by rankzoo report --hf: the layer pattern of {key}")
    exp = load_experiment(path)
    labels = [s.label for s in exp.variants["pattern"].layer_specs(exp.model.n_layers)]
    assert labels == (["local"] * 5 + ["global"] if key == "gemma3_text" else ["ssm", "global"])
    assert main(["train", str(path), "--dry-run", "--format", "json"]) == 0
    plan = {v["variant"]: v for v in json.loads(capsys.readouterr().out)["variants"]}
    assert set(plan) == set(exp.variants)
    assert all(abs(v["rel_diff"]) <= 0.05 for v in plan.values())  # matched in parameters
    assert [ly["label"] for ly in plan["pattern"]["layers"]] == labels


def test_an_existing_file_is_refused_before_the_probe(capsys, saved, text_file, tmp_path):
    path = tmp_path / "mirror.yaml"
    path.write_text("keep me\n")
    code, _, err = _cli(capsys, saved("llama"), text_file, "--emit", path, "--d-model", 32,
                        "--n-heads", 2)
    assert code == 2 and "exists; pass --force" in err and "measured" not in err
    assert path.read_text() == "keep me\n"
    code, _, err = _cli(capsys, saved("llama"), text_file, "--emit", path, "--d-model", 32,
                        "--n-heads", 2, "--force")
    assert code == 0, err
    assert "not a hybrid" in err and list(load_experiment(path).variants) == ["global"]


def _refusal(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr) of a refused command, whether argparse or the verb refused."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (("--d-model", 64, "--n-heads", 3), "--n-heads 3: must divide --d-model 64"),
    (("--d-model", 64, "--n-heads", 4, "--n-layers", 7),
     "--n-layers 7: gemma3_text's unit is 6 layers (sliding W=8 x5, global)"),
    (("--d-model", 64, "--n-heads", 4, "--window", 40), "--window 40: expected 2 <= W"),
    (("--d-model", 64, "--n-heads", 4, "--train-seq-len", 4), "--train-seq-len 4: MQAR"),
    (("--d-model", 0, "--n-heads", 4), "--d-model: expected a positive int, got 0"),
    (("--n-heads", 4), "needs --d-model D and --n-heads H"),
    (("--d-model", 64, "--n-heads", 4, "--layers", "0-2"), "drop --layers 0-2"),
])
def test_a_bad_size_flag_names_its_value(capsys, saved, text_file, tmp_path, flags, named):
    path = tmp_path / "mirror.yaml"
    code, err = _refusal(capsys, "report", "--hf", saved("gemma3_text"), "--text", text_file,
                         "--seq-len", T, "--probe-size", P, "--emit", path, *flags)
    assert code == 2 and named in err, err
    assert not path.exists()


@pytest.mark.parametrize("flags, named", [
    (("--hf", "MODEL", "--text", "t.txt", "--d-model", 64), "--d-model 64 only applies "
                                                             "with --emit FILE"),
    (("runs/x", "--emit", "m.yaml"), "--emit m.yaml applies to --hf PATH"),
])
def test_emit_flags_out_of_place_are_refused(capsys, flags, named):
    code, err = _refusal(capsys, "report", *flags)
    assert code == 2 and named in err, err
