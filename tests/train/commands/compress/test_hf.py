"""`rankzoo compress --hf`: Hugging Face causal LMs with low-rank KV caches.

Tiny random models are saved into tmp directories: nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="compress --hf needs transformers (pip install 'rankzoo[hf]')")

from train.cli import main  # noqa: E402
from train.commands.compress import CompressOptions, compress_hf  # noqa: E402
from train.commands.compress.bases.calibrate import calibrate, disjoint_rows, hf_data  # noqa: E402
from train.commands.compress.bases.lowrank import projectors  # noqa: E402
from train.commands.compress.target.hf_surgery import HFTarget  # noqa: E402
from train.hf import load_model  # noqa: E402


def _cli(capsys, *args):
    code = main(["compress", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


WORDS = ("the", "cat", "sat", "on", "a", "mat", "while", "rank", "and", "budget", "met", "in",
         "zoo", "of", "heads", "keys", "values", "queries", "cache", "layer", "token", "mixing")


def _text(seed: int, n: int = 600) -> str:
    picks = torch.randint(len(WORDS), (n,), generator=torch.Generator().manual_seed(seed))
    return " ".join(WORDS[i] for i in picks.tolist()) + "\n"


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    root = tmp_path_factory.mktemp("texts")
    (root / "calib.txt").write_text(_text(0))
    (root / "eval.txt").write_text(_text(1))
    return root / "calib.txt", root / "eval.txt"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("hf") / "tiny-llama"
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    torch.manual_seed(1)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                     n_positions=128)
    path = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def exact_at_full_rank(target: HFTarget, ids: torch.Tensor, batch: int, bases: str,
                       exact: float, moved: float):
    """Calibrate; every slot at full rank gives the model's loss (within `exact`), at rank
    1 it moves it (by more than `moved`), and the surgery is undone. Returns the
    calibration."""
    before = target.evaluate(ids)["loss"]
    cal = calibrate(target, ids, batch, bases)
    P = {s.key: projectors(cal.bases[s.key], [s.width] * s.heads, cal.encoders[s.key])
         for s in target.slots}
    with target.projected(P):
        assert target.evaluate(ids)["loss"] == pytest.approx(before, abs=exact)
    low = {s.key: projectors(cal.bases[s.key], [1] * s.heads, cal.encoders[s.key])
           for s in target.slots}
    with target.projected(low):
        assert abs(target.evaluate(ids)["loss"] - before) > moved
    assert target.evaluate(ids)["loss"] == before  # undone
    return cal


@pytest.mark.parametrize("bases", ["energy", "output"])
@pytest.mark.parametrize("which, keys", [("llama", "pre-rope"), ("llama", "post-rope"),
                                         ("gpt2", "auto")])
def test_hf_full_rank_equals_the_original(which, keys, bases, llama_dir, gpt2_dir, texts):
    model, _ = load_model(llama_dir if which == "llama" else gpt2_dir)
    target = HFTarget(model, keys)
    ids = torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(0))
    cal = exact_at_full_rank(target, ids, 2, bases, exact=2e-6, moved=1e-5)
    assert set(cal.used.values()) == {bases}  # every slot got the bases asked for


def test_hf_pre_and_post_rope_projections_differ(llama_dir):
    model, _ = load_model(llama_dir)
    ids = torch.randint(0, 64, (3, 24), generator=torch.Generator().manual_seed(0))
    losses = []
    for keys in ("pre-rope", "post-rope"):
        target = HFTarget(model, keys)
        cal = calibrate(target, ids, 3)
        P = {s.key: projectors(cal.bases[s.key], [2] * s.heads) for s in target.slots}
        with target.projected(P):
            losses.append(target.evaluate(ids)["loss"])
    assert abs(losses[0] - losses[1]) > 1e-6


def test_hf_calibration_and_evaluation_never_overlap_unless_asked(texts):
    calib_text, eval_text = texts
    data = calib_text.read_bytes()
    notes = []
    calib, evals = hf_data(data, data, None, 64, 16, 3, 2, False, "c", "c", notes)
    ids = torch.tensor(list(data)) % 64
    assert torch.equal(calib.flatten(), ids[:48])
    assert torch.equal(evals.flatten(), ids[48:80])  # after the calibration tokens
    assert "evaluation starts after its first 48 tokens" in notes[-1]
    _, evals = hf_data(data, data, None, 64, 16, 3, 2, True, "c", "c", notes)
    assert torch.equal(evals, calib[:2])  # asked for
    # another file holding a calibration sequence: it is left out
    other = data[:16] + eval_text.read_bytes()
    _, evals = hf_data(data, other, None, 64, 16, 3, 3, False, "c", "e", notes)
    assert len(evals) == 2 and len(disjoint_rows(calib, evals)) == 2
    assert "1 evaluation sequences equal calibration sequences" in notes[-1]
    with pytest.raises(ValueError, match="every evaluation sequence is a calibration sequence"):
        hf_data(data, data[:48], None, 64, 16, 3, 3, False, "c", "e", notes)


def test_hf_cli_table_json_and_save(llama_dir, texts, capsys, tmp_path):
    calib_text, eval_text = texts
    code, out, err = _cli(capsys, "--hf", llama_dir, "--text", calib_text, "--eval-text",
                          eval_text, "--seq-len", 16, "--ratios", "1.5,2", "--format", "json",
                          "--device", "cpu", "--save", tmp_path / "small", "--tolerance", "5")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["source"]["model_type"] == "llama" and doc["keys"] == "pre-rope"
    assert doc["prediction"]["source"].startswith("the KV advice of `rankzoo report --hf")
    assert "perplexity" in doc["rows"][0] and doc["verdict"]["verdict"] == "verified"
    saved = tmp_path / "small"
    assert (saved / "config.json").is_file() and (saved / "bases.pt").is_file()
    model, _ = load_model(saved)  # the compressed weights, read back as any HF model
    evals = hf_data(calib_text.read_bytes(), eval_text.read_bytes(), None, 64, 16, 4, 4,
                    False, "c", "e", [])[1]
    row = json.loads((saved / "compress.json").read_text())["row"]
    assert HFTarget(model).evaluate(evals)["loss"] == pytest.approx(row["loss"], abs=1e-5)
    code, out, err = _cli(capsys, "--hf", llama_dir, "--text", calib_text, "--eval-text",
                          eval_text, "--seq-len", 16, "--ratios", "2")
    assert code == 0 and "verdict:" in out and "perplexity" in out


@pytest.mark.parametrize("args, message", [
    (("--text", "{calib}"), "needs --eval-text FILE"),
    (("--text", "{calib}", "--eval-text", "{calib}", "--keys", "pre-rope"),
     "--keys pre-rope: the gpt2 model has no RoPE"),
    (("--text", "{calib}", "--eval-text", "{missing}"), "--eval-text"),
])
def test_hf_bad_input_is_one_line(gpt2_dir, texts, capsys, tmp_path, args, message):
    args = [a.format(calib=texts[0], missing=tmp_path / "missing.txt") for a in args]
    code, out, err = _cli(capsys, "--hf", gpt2_dir, *args, "--seq-len", 16)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert message in err


def test_compress_hf_library_call(llama_dir, texts):
    doc = compress_hf(llama_dir, *texts, CompressOptions(ratios=(2,)), seq_len=16)
    assert [r["allocation"] for r in doc["rows"]] == [
        "full", "advised", "uniform", "sensitivity", "mixed"]
    assert doc["calibration"]["tokens"] == 4 * 16 and doc["evaluation"]["sequences"] == 4


@pytest.mark.parametrize("model_type, keys", [
    ("qwen3", "pre-rope"),        # keys through a per-head k_norm, [B, T, G, K]
    ("gemma3_text", "pre-rope"),  # k_norm after the head transpose, [B, G, T, K]
    ("gpt_neox", "pre-rope"),     # q/k/v fused and interleaved per head
    ("phi", "pre-rope"),          # partial rotary
    ("gpt_oss", "post-rope"),     # sinks and windows, keys projected inside the attention
])
def test_full_rank_equals_the_original_on_any_layout(model_type, keys):
    from tests.hf_tiny import tiny_model

    target = HFTarget(tiny_model(model_type), keys)
    ids = torch.randint(3, 128, (3, 24), generator=torch.Generator().manual_seed(0))
    exact_at_full_rank(target, ids, 3, "output", exact=2e-5, moved=1e-4)


def test_sequences_start_with_the_bos_asked_for(texts):
    data = texts[0].read_bytes()
    ids = torch.tensor(list(data)) % 64
    calib, evals = hf_data(data, data, None, 64, 16, 3, 2, False, "c", "c", [], bos=5)
    assert (calib[:, 0] == 5).all() and (evals[:, 0] == 5).all()
    assert torch.equal(calib[:, 1:].flatten(), ids[:45])  # 15 text tokens a row
    assert torch.equal(evals[:, 1:].flatten(), ids[45:75])  # after the calibration's


def llama_delta(seed: int, bases: str, r: int) -> float:
    """A tiny random Llama (weights at std 0.2: attention sharp enough to matter): the loss
    change at rank r of every slot on held-out ids, against the full model's predictions."""
    import torch.nn.functional as F

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, max_position_embeddings=128,
        initializer_range=0.2)
    model = transformers.LlamaForCausalLM(config).eval()
    target = HFTarget(model)
    g = torch.Generator().manual_seed(seed + 100)
    calib = torch.randint(0, 64, (8, 32), generator=g)
    x = torch.randint(0, 64, (8, 32), generator=g)

    def loss(y=None):
        with torch.no_grad():
            logits = model(input_ids=x).logits.float()  # [B, T, vocab]
        y = logits.argmax(-1) if y is None else y
        return float(F.cross_entropy(logits.flatten(0, 1), y.flatten())), y

    base, y = loss()
    cal = calibrate(target, calib, 4, bases)
    P = {s.key: projectors(cal.bases[s.key], [r] * s.heads, cal.encoders[s.key])
         for s in target.slots}
    with target.projected(P):
        return loss(y)[0] - base


def test_hf_output_bases_lose_less_than_energy_bases_at_equal_rank():
    deltas = {(seed, r): {b: llama_delta(seed, b, r) for b in ("energy", "output")}
              for seed in range(3) for r in (4, 6)}
    wins = sum(d["output"] <= d["energy"] for d in deltas.values())
    assert wins > len(deltas) / 2, deltas
    clear = deltas[(1, 6)]
    assert clear["output"] < 0.9 * clear["energy"], clear


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gpt_oss"])
def test_hf_output_gains_predict_the_attention_error_on_one_scale(model_type):
    # what a slot drops at rank r, times its layer's residual energy, is the squared
    # error of that layer's attention output (after W_O) per token, to first order:
    # windows, GQA and sink logits included; within a factor of 3 on these tiny models
    from tests.hf_tiny import tiny_model

    model = tiny_model(model_type)
    with torch.no_grad():  # sharper attention than the tiny models' init gives
        for name, p in model.named_parameters():
            if p.dim() == 2 and any(k in name for k in ("q_proj", "k_proj")):
                p.mul_(4.0)
    target = HFTarget(model, "post-rope" if model_type == "gpt_oss" else "auto")
    ids = torch.randint(3, 128, (4, 32), generator=torch.Generator().manual_seed(0))
    cal = calibrate(target, ids, 4, "output")
    assert cal.one_scale

    def outputs():
        outs = {}
        hooks = [layer.out.register_forward_hook(
            lambda m, a, o, i=i: outs.__setitem__(i, o.detach()))
            for i, layer in enumerate(target.layers)]
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        for h in hooks:
            h.remove()
        return outs

    base = outputs()
    full = {s.key: [s.width] * s.heads for s in target.slots}
    for s in target.slots:
        for r in (2, 4):
            ranks = {**full, s.key: [r] * s.heads}
            P = {k: projectors(cal.bases[k], ranks[k], cal.encoders[k]) for k in ranks}
            with target.projected(P):
                out = outputs()[s.layer]
            measured = float((out - base[s.layer]).double().square().sum(-1).mean())
            predicted = float(cal.energy[s.key][:, r:].sum()) * cal.residual[s.layer]
            assert 1 / 3 < measured / predicted < 3.0, (s.key, r, measured, predicted)


# hybrids: the attention layers' KV caches compressed, every other mixer's state kept
HYBRIDS = {  # model type -> (attention layers, what the header names as kept)
    "qwen3_next": ([3], "layers 0-2 (Qwen3NextGatedDeltaNet) keep their state in full"),
    "jamba": ([2], "layers 0-1, 3 (JambaMambaMixer) keep their state in full"),
    "falcon_h1": ([0, 1], "layers 0-1 (FalconH1Mixer) keep their state in full"),
    "lfm2": ([1], "layers 0, 2 (Lfm2ShortConv) keep their state in full"),
}


def _logits(target: HFTarget, ids: torch.Tensor) -> torch.Tensor:
    return HFTarget.logits(target.model, ids).double()


@pytest.mark.parametrize("model_type", sorted(HYBRIDS))
def test_hybrid_compresses_its_attention_layers_by_their_own_numbers(model_type):
    from tests.hf_tiny import tiny_model

    numbers, kept = HYBRIDS[model_type]
    target = HFTarget(tiny_model(model_type))
    paths = [int(layer.name.split(".")[2]) for layer in target.layers]  # model.layers.N.x
    assert [s.layer for s in target.slots][::2] == paths == numbers
    assert kept in target.describe() and "counted in B/token" in target.describe()
    ids = torch.randint(3, 128, (3, 24), generator=torch.Generator().manual_seed(0))
    residual = {}
    target.activations(ids, residual=residual)
    assert sorted(residual) == numbers  # the stream entering each attention layer
    cal = exact_at_full_rank(target, ids, 3, "output", exact=2e-5, moved=1e-4)
    before = _logits(target, ids)
    full = {s.key: projectors(cal.bases[s.key], [s.width] * s.heads, cal.encoders[s.key])
            for s in target.slots}
    with target.projected(full):
        assert (_logits(target, ids) - before).abs().max() < 1e-4


def test_hybrid_states_are_counted_once_per_sequence():
    from tests.hf_tiny import tiny_model
    from train.commands.compress.bases.lowrank import cache_bytes, full_ranks

    target = HFTarget(tiny_model("qwen3_next"))
    # 3 Gated DeltaNet layers: conv state (2 x 32 key + 64 value channels) x kernel 4, and
    # the delta state, 4 value heads x K 16 x V 16
    assert [(k.layer, k.elements) for k in target.kept] == [(n, 128 * 4 + 4 * 16 * 16)
                                                            for n in range(3)]
    kv = 2 * 2 * 16 * 2  # keys and values of 2 KV heads of 16, at 2 bytes
    for T in (32, 1024):
        full = cache_bytes(target.slots, full_ranks(target.slots), 2, T)
        assert full["full_bytes_per_token"] == pytest.approx(kv + 3 * 1536 * 2 / T)


def test_hybrid_save_decodes_through_the_low_rank_cache(texts, tmp_path):
    from tests.hf_tiny import tiny_model

    calib_text, eval_text = texts
    for model_type in ("falcon_h1", "jamba"):
        tiny_model(model_type).save_pretrained(tmp_path / model_type)
        doc = compress_hf(tmp_path / model_type, calib_text, eval_text,
                          CompressOptions(ratios=(1.2,), tolerance=5, cache_dtype="float32",
                                          save=str(tmp_path / f"{model_type}-small")),
                          seq_len=32)
        assert doc["layers"] == HYBRIDS[model_type][0]
        kept = {"falcon_h1": [0, 1], "jamba": [0, 1, 3]}[model_type]
        assert [k["layer"] for k in doc["kept"]] == kept
        check = doc["saved"]["cache"]  # the states beside the codes, as the row counts
        assert check["held_bytes"] == check["reported_bytes"], (model_type, check)
        assert check["max_logit_error"] < 1e-4, (model_type, check)


def test_hybrid_save_refused_before_any_work_where_it_is_no_change_of_weights(
        texts, tmp_path, capsys):
    from tests.hf_tiny import tiny_model

    tiny_model("qwen3_next").save_pretrained(tmp_path / "qwen3_next")
    capsys.readouterr()  # save_pretrained's progress bar
    code, out, err = _cli(capsys, "--hf", tmp_path / "qwen3_next", "--text", texts[0],
                          "--eval-text", texts[1], "--seq-len", 16, "--save", tmp_path / "s")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "normalizes its keys (k_norm)" in err and not (tmp_path / "s").exists()


@pytest.mark.parametrize("model_type, message", [
    # its hybrid layers' attention: one module per layer, one W_K shared by layers 1 and 3
    ("zamba", "attention layers model.layers.1.shared_transf.self_attn, "
              "model.layers.3.shared_transf.self_attn share their weights"),
    # lightning attention's state lives in a cache class of its own: no low-rank decoding
    ("minimax", "--save {save}: the minimax model keeps its cache in a MiniMaxCache"),
])
def test_hybrid_refused_in_one_line_before_any_work(model_type, message, texts, tmp_path,
                                                   capsys):
    from tests.hf_tiny import tiny_model

    tiny_model(model_type).save_pretrained(tmp_path / model_type)
    capsys.readouterr()  # save_pretrained's progress bar
    save = tmp_path / "s"
    code, out, err = _cli(capsys, "--hf", tmp_path / model_type, "--text", texts[0],
                          "--eval-text", texts[1], "--seq-len", 16, "--save", save)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert message.format(save=save) in err and not save.exists()
