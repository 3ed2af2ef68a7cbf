"""`rankzoo report --hf PATH --text FILE`: rank-budget reports on saved Hugging Face LMs.

Tiny random models are built from configs and saved into tmp directories: nothing is
downloaded. The realized attention ranks are checked against ranks computed here,
independently, from the model's own output_attentions.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="rankzoo report --hf needs transformers (pip install 'rankzoo[hf]')")

import budgets  # noqa: E402
from tests.train.hf.conftest import probe_report  # noqa: E402
from train.cli import main  # noqa: E402
from train.hf import import_transformers, offline, probe_hf  # noqa: E402

T, P = 32, 2  # seq len, probe size: the probe batch needs 64 tokens
H, G, K, D = 4, 2, 8, 32  # the Llama: GQA, 2 query heads per KV head
WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "rank", "and", "budget", "met", "in",
         "zoo", "of", "heads", "keys", "values", "queries", "cache", "layer", "token", "mixing")


def _text() -> str:
    g = torch.Generator().manual_seed(0)
    picks = torch.randint(len(WORDS), (400,), generator=g)
    return " ".join(WORDS[i] for i in picks.tolist()) + "\n"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(_text())
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=64, num_hidden_layers=2, num_attention_heads=H,
        num_key_value_heads=G, vocab_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def _word_tokenizer():
    """A word-level tokenizer over WORDS, built offline with the tokenizers library."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    torch.manual_seed(1)
    config = transformers.GPT2Config(n_embd=D, n_layer=2, n_head=H, vocab_size=64,
                                     n_positions=128, bos_token_id=0, eos_token_id=0)
    path = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    _word_tokenizer().save_pretrained(path)
    return path


def _cli(capsys, *args):
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _json_report(capsys, model_dir, text_file, *flags, seq_len=T):
    code, out, err = _cli(capsys, "--hf", model_dir, "--text", text_file, "--seq-len", seq_len,
                          "--probe-size", P, "--format", "json", *flags)
    assert code == 0, err
    return json.loads(out), err


def _rows(layer):
    return {a["quantity"]: a for a in layer["axes"]}


# ---------------------------------------------------------------- reports

def test_table_through_the_cli(capsys, llama_dir, text_file):
    code, out, err = _cli(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", T,
                          "--probe-size", P)
    assert code == 0, err
    # the short answer first, then what each kind of layer uses; every table on request
    assert out.startswith("summary: tiny-llama") and "past->future erank" in out
    assert "per kind of layer" in out and "--details" in out
    assert "inference: caches and states" not in out and "pretrain:" not in out
    assert "raw bytes modulo the vocab size (64)" in err  # no tokenizer saved: said so
    code, out, _ = _cli(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", T,
                        "--probe-size", P, "--details")
    assert code == 0 and "inference: caches and states" in out and "pretrain:" in out


def test_json_rows_and_caps_match_the_config(capsys, llama_dir, text_file):
    report, _ = _json_report(capsys, llama_dir, text_file)
    assert report["schema"] == "rankzoo.report" and report["source"]["model_type"] == "llama"
    (variant,) = report["variants"]
    assert variant["variant"] == "tiny-llama" and variant["seq_len"] == T
    assert len(variant["layers"]) == 2
    for layer in variant["layers"]:
        rows = _rows(layer)
        assert set(rows) == {"past_future", "qk", "value", "out", "inference.k", "inference.v"}
        assert rows["out"]["declared"] == min(D, H * K)  # W_O [D, H*K]: its structural cap
        assert rows["past_future"]["declared"] == T // 2
        assert rows["qk"]["declared"] == K
        assert rows["value"]["declared"] == min(D, G * K)
        assert rows["inference.k"]["declared"] == min(T, G * K)
        assert len(rows["past_future"]["per_head"]) == H and len(rows["qk"]["per_head"]) == H
        assert len(rows["inference.v"]["per_head"]) == 1
        assert {len(v) for q, v in layer["erank"].items() if q != "hidden_centered"} == {H}
        assert all(a["verdict"] in budgets.VERDICTS for a in layer["axes"])


def test_short_sequences_cap_the_kv_cache_at_t(llama_dir, text_file):
    report = probe_report(llama_dir, text_file, seq_len=8, probe_size=P)
    rows = _rows(report["variants"][0]["layers"][0])
    assert rows["inference.k"]["declared"] == min(8, G * K) == 8
    assert rows["past_future"]["declared"] == 4


def _probe_ids(model_dir, text_file, vocab=64):
    data = text_file.read_bytes()
    if (model_dir / "tokenizer.json").is_file():
        tok = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        ids = torch.tensor(tok(data.decode(), add_special_tokens=False)["input_ids"])
    else:
        ids = torch.tensor(list(data)) % vocab
    return ids[: P * T].view(P, T)


@pytest.mark.parametrize("which", ["llama_dir", "gpt2_dir"])
def test_realized_ranks_equal_an_independent_measurement(request, which, text_file):
    model_dir = request.getfixturevalue(which)
    report = probe_report(model_dir, text_file, seq_len=T, probe_size=P)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True, attn_implementation="eager")
    with torch.no_grad():
        out = model(_probe_ids(model_dir, text_file), output_attentions=True,
                    output_hidden_states=True)
    final = out.hidden_states[-1].reshape(P * T, -1)  # the final norm's output, pooled
    assert report["variants"][0]["final_hidden_centered_erank"] == pytest.approx(
        float(budgets.rank_metrics(final, center=True)["erank"]), rel=1e-4)
    norms = ([layer.input_layernorm for layer in model.model.layers] if which == "llama_dir"
             else [block.ln_1 for block in model.transformer.h])
    for layer, x, norm in zip(report["variants"][0]["layers"], out.hidden_states, norms,
                              strict=False):  # the residual stream, through the pre-norm
        with torch.no_grad():
            want = budgets.rank_metrics(norm(x), center=True)["erank"].mean()  # per sample
        assert layer["hidden_centered_erank"] == pytest.approx(float(want), rel=1e-4)
    for layer, A in zip(report["variants"][0]["layers"], out.attentions, strict=True):
        assert A.shape == (P, H, T, T)
        past_future = budgets.rank_metrics(A[..., T // 2:, : T // 2])  # [P, H] per metric
        raw, centered = budgets.rank_metrics(A), budgets.rank_metrics(A, center=True)
        assert _rows(layer)["past_future"]["per_head"] == pytest.approx(
            past_future["rank_eps"].mean(0).tolist())  # means over the batch: [H]
        for quantity, m in (("past_future", past_future), ("mixing", raw),
                            ("mixing_centered", centered)):
            assert layer["erank"][quantity] == pytest.approx(m["erank"].mean(0).tolist(),
                                                             rel=1e-4)


def test_qk_ranks_equal_the_dense_product(llama_dir, text_file):
    # the probe entry keeps every metric; rank_eps alone reads K for all random heads
    _, entry = probe_hf(llama_dir, text_file, seq_len=T, probe_size=P)
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, local_files_only=True)
    attn = model.model.layers[1].self_attn
    wq = attn.q_proj.weight.detach().view(H, K, D)
    wk = attn.k_proj.weight.detach().view(G, K, D)[[h // (H // G) for h in range(H)]]
    dense = budgets.rank_metrics(wq.transpose(1, 2) @ wk)  # of [H, D, D], materialized
    measured = entry["probe"]["layers"][1]["quantities"]["qk"]
    for metric in ("rank_eps", "erank", "stable_rank", "numerical_rank"):
        assert measured[metric] == pytest.approx(dense[metric].tolist(), rel=1e-4), metric


def test_gpt2_with_its_tokenizer(capsys, gpt2_dir, text_file):
    report, err = _json_report(capsys, gpt2_dir, text_file)
    assert "raw bytes" not in err and report["source"]["tokens"] == "tokenizer"
    rows = _rows(report["variants"][0]["layers"][0])
    assert rows["value"]["declared"] == min(D, H * K)  # no GQA: G = H
    assert rows["inference.v"]["declared"] == min(T, H * K)
    assert report["variants"][0]["layers"][0]["block"] == "gpt2"


@pytest.mark.parametrize("name", ["Mistral", "Mixtral", "Qwen2", "Qwen3", "Gemma2", "Olmo2"])
def test_llama_style_families(tmp_path, text_file, name):
    config = getattr(transformers, f"{name}Config")(
        hidden_size=D, intermediate_size=64, num_hidden_layers=1, num_attention_heads=H,
        num_key_value_heads=G, head_dim=K, vocab_size=64, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    getattr(transformers, f"{name}ForCausalLM")(config).save_pretrained(tmp_path / name)
    rows = _rows(probe_report(tmp_path / name, text_file, seq_len=T, probe_size=P)
                 ["variants"][0]["layers"][0])
    assert rows["inference.k"]["declared"] == min(T, G * K) and rows["qk"]["declared"] == K


def test_markdown_and_plots_leave_the_model_dir_alone(capsys, tmp_path, llama_dir, text_file):
    before = {p.name: p.stat().st_mtime_ns for p in llama_dir.iterdir()}
    code, out, err = _cli(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", T,
                          "--probe-size", P, "--format", "md", "--plot", tmp_path / "plots")
    assert code == 0, err
    assert "| variant |" in out and "## Effective ranks per layer" in out
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "declared_vs_realized.png", "heads_tiny-llama.png", "spectrum_tiny-llama.png"]
    assert {p.name: p.stat().st_mtime_ns for p in llama_dir.iterdir()} == before


# ---------------------------------------------------------------- bad input

def _error(capsys, *args) -> str:
    code, out, err = _cli(capsys, *args)
    assert code == 2 and not out
    assert err.splitlines()[-1].startswith("rankzoo: error:")  # after any notes
    return err


def test_empty_and_short_text(capsys, tmp_path, llama_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "empty" in _error(capsys, "--hf", llama_dir, "--text", empty)
    short = tmp_path / "short.txt"
    short.write_text("ten bytes\n")
    err = _error(capsys, "--hf", llama_dir, "--text", short, "--seq-len", T, "--probe-size", P)
    assert "10 tokens" in err and f"needs {P * T}" in err
    assert "not found" in _error(capsys, "--hf", llama_dir, "--text", tmp_path / "nope.txt")


def test_bad_model_directories(capsys, tmp_path, text_file, llama_dir):
    assert "model directory not found" in _error(capsys, "--hf", tmp_path / "nope",
                                                 "--text", text_file)
    assert "no config.json" in _error(capsys, "--hf", tmp_path, "--text", text_file)
    vit = tmp_path / "vit"  # an image encoder: transformers has no causal LM of that type
    vit.mkdir()
    (vit / "config.json").write_text(json.dumps({"model_type": "vit"}))
    err = _error(capsys, "--hf", vit, "--text", text_file)
    assert "'vit' is not supported" in err and "no causal LM of that type" in err
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_bytes((llama_dir / "config.json").read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "does not load" in _error(capsys, "--hf", corrupt, "--text", text_file)


def test_seq_len_beyond_the_position_embedding(capsys, llama_dir, text_file):
    err = _error(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", 256,
                 "--probe-size", 1)
    assert "--seq-len 256" in err and "128" in err


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import now raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'rankzoo\[hf\]'"):
        import_transformers()


def test_offline_mode_is_scoped(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    with offline():
        assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in os.environ and os.environ["TRANSFORMERS_OFFLINE"] == "0"


def test_library_errors_name_parameters(tmp_path, llama_dir, text_file):
    # the CLI turns these into its flags (see test_seq_len_beyond_the_position_embedding)
    with pytest.raises(FileNotFoundError, match=r"^model_dir=\S+: model directory not found"):
        probe_hf(tmp_path / "nope", text_file)
    with pytest.raises(FileNotFoundError, match=r"^text=\S+: file not found"):
        probe_hf(llama_dir, tmp_path / "nope.txt")
    with pytest.raises(ValueError, match=r"^seq_len=256 exceeds"):
        probe_hf(llama_dir, text_file, seq_len=256, probe_size=1)
    with pytest.raises(ValueError, match=r"but probe_size=64 x seq_len=128 needs 8192$"):
        probe_hf(llama_dir, text_file, seq_len=128, probe_size=64)


@pytest.mark.parametrize("argv", [
    ["report"],                                   # neither RUN_DIR nor --hf
    ["report", "runs/x", "--hf", "m", "--text", "t"],  # both
    ["report", "--hf", "m"],                      # --hf without --text
    ["report", "runs/x", "--text", "t"],          # --text without --hf
    ["report", "runs/x", "--adapter", "a"],       # --adapter without --hf
    ["report", "runs/x", "--eps", "0.2"],         # a probe option without --hf
    ["report", "runs/x", "--matfree-from", "never"],
])
def test_report_needs_exactly_one_source(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "rankzoo: error:" in capsys.readouterr().err


# ---------------------------------------------------------------- probe options

def test_json_on_stdout_progress_on_stderr(capsys, llama_dir, text_file):
    code, out, err = _cli(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", T,
                          "--probe-size", P, "--format", "json", "--device", "cpu",
                          "--eps", 0.2, "--layers", 1, "--matfree-from", 16, "--k-max", 32)
    assert code == 0, err
    report = json.loads(out)  # stdout is the one JSON document, nothing else
    assert report["source"]["layers"] == [1] and report["source"]["n_layers"] == 2
    assert report["source"]["matfree"] == {"from": 16, "k_max": 32}
    assert report["source"]["device"] == "cpu" and report["variants"][0]["eps"] == 0.2
    assert [layer["layer"] for layer in report["variants"][0]["layers"]] == [1]
    assert re.search(r"^rankzoo: layer 1 · 1/1 measured · [\d.]+ s · ETA 0 s$", err, re.M)
    assert "measured 1 of the model's 2 layers: 1" in err and "matrix-free" in err


def test_progress_of_the_exact_path(capsys, llama_dir, text_file):
    code, out, err = _cli(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", T,
                          "--probe-size", P, "--format", "md", "--matfree-from", "never")
    assert code == 0, err
    progress = [line for line in err.splitlines() if line.startswith("rankzoo: layer")]
    assert [line.split(" · ")[1] for line in progress] == ["1/2 measured", "2/2 measured"]
    assert "matrix-free" not in err and "| variant |" in out


def test_a_bfloat16_forward_pass(capsys, llama_dir, text_file):
    report, err = _json_report(capsys, llama_dir, text_file, "--dtype", "bfloat16")
    assert report["source"]["dtype"] == "bfloat16"
    assert "forward pass in bfloat16" in err
    plain, _ = _json_report(capsys, llama_dir, text_file)
    assert plain["source"]["dtype"] == "float32"
    assert _rows(report["variants"][0]["layers"][0])["qk"]["declared"] == K


def _parse_error(capsys, *args) -> str:
    """The last stderr line of `rankzoo report ARGS`, which must exit with status 2."""
    try:
        code = main(["report", *map(str, args)])
    except SystemExit as e:  # argparse's error(): before anything is loaded
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2 and not out, err
    return err.splitlines()[-1]


@pytest.mark.parametrize("flags, message", [
    (["--layers", "0,2"], "--layers 2: out of range; the llama model has 2 layers (0-1)"),
    (["--layers", "1-0"], "--layers 1-0: the range '1-0' runs backwards"),
    (["--layers", "0,,1"], "--layers 0,,1: expected layer indices and ranges like 0,5,10-12, "
                           "got ''"),
    (["--eps", "1"], "--eps 1: expected 0 < eps < 1"),
    (["--eps", "x"], "--eps x: expected a number between 0 and 1"),
    (["--matfree-from", "0"], "--matfree-from 0: expected a positive int, got 0"),
    (["--k-max", "many"], "--k-max many: expected a positive int, got 'many'"),
    (["--device", "tpu"], "--device tpu: not a device; one of cpu, cuda, auto"),
    (["--dtype", "int8"], "--dtype int8: not a forward-pass dtype; one of float32, "
                          "bfloat16, float16"),
])
def test_bad_probe_options_are_one_line_errors(capsys, llama_dir, text_file, flags, message):
    line = _parse_error(capsys, "--hf", llama_dir, "--text", text_file, "--seq-len", T,
                        "--probe-size", P, *flags)
    assert line == f"rankzoo: error: {message}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda_is_named(capsys, llama_dir, text_file):
    line = _parse_error(capsys, "--hf", llama_dir, "--text", text_file, "--device", "cuda")
    assert line.startswith("rankzoo: error: --device cuda: CUDA is not available here")


# ---------------------------------------------------------------- a PEFT adapter on top

@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, llama_dir):
    """A PEFT LoRA adapter for the tiny Llama: r 4 on q_proj, r 2 on v_proj and up_proj
    (rank_pattern), B random (PEFT starts it at zero, which would realize nothing)."""
    peft = pytest.importorskip("peft", reason="--adapter needs PEFT (pip install peft)")
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, local_files_only=True)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                             rank_pattern={"v_proj": 2, "up_proj": 2})
    wrapped = peft.get_peft_model(model, config)
    torch.manual_seed(2)
    for name, p in wrapped.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)
    path = tmp_path_factory.mktemp("adapter") / "lora"
    wrapped.save_pretrained(path)
    return path, {n: p.detach().clone() for n, p in wrapped.named_parameters() if "lora_" in n}


def test_a_peft_adapter_fills_the_adapter_axis(capsys, llama_dir, text_file, adapter_dir):
    path, saved = adapter_dir
    code, out, err = _cli(capsys, "--hf", llama_dir, "--adapter", path, "--text", text_file,
                          "--seq-len", T, "--probe-size", P, "--format", "json")
    assert code == 0, err
    (variant,) = json.loads(out)["variants"]
    assert json.loads(out)["source"]["adapter"] == str(path)
    plain = probe_report(llama_dir, text_file, seq_len=T, probe_size=P)["variants"][0]
    assert variant["metrics"]["probe/loss"] != plain["metrics"]["probe/loss"]  # it acts
    assert variant["budget_total"] == plain["budget_total"] + 2 * (4 + 2 + 2)
    for i, layer in enumerate(variant["layers"]):
        rows = {a["quantity"]: a for a in layer["axes"] if a["axis"] == "adapter"}
        assert {q: a["declared"] for q, a in rows.items()} == {
            "adapter.self_attn.q_proj.default": 4, "adapter.self_attn.v_proj.default": 2,
            "adapter.mlp.up_proj.default": 2}
        A = saved[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.default.weight"]
        B = saved[f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.default.weight"]
        s = torch.linalg.svdvals(2.0 * B.double() @ A.double())[:4]  # scaling = 8 / 4
        want = budgets.spectrum_metrics(s, (D, D), 0.1)["rank_eps"]
        assert rows["adapter.self_attn.q_proj.default"]["realized_mean"] == float(want)


def test_a_bad_adapter_is_named(capsys, tmp_path, llama_dir, text_file):
    code, _, err = _cli(capsys, "--hf", llama_dir, "--adapter", tmp_path, "--text", text_file)
    assert code == 2 and f"--adapter {tmp_path}: no adapter_config.json" in err
    (tmp_path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": "x"}')
    code, _, err = _cli(capsys, "--hf", llama_dir, "--adapter", tmp_path, "--text", text_file)
    assert code == 2 and f"--adapter {tmp_path}: the adapter does not load" in err
