"""`rankzoo compress --save`'s low-rank cache: a saved model decodes holding the bytes its row
reports, and gives the logits of the model compress measured.

Zoo variants are written by hand (config.yaml, a checkpoint of seeded weights); Hugging
Face models are tiny random ones saved into tmp directories: nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch

from train.cli import main
from train.commands.compress import CompressOptions, compress_run, load_compressed
from train.commands.compress.saved.load import measure_saved
from train.commands.compress.target.cache import SlotCodes, held_bytes, unrotate_half
from zoo.rope import apply_rope

transformers = pytest.importorskip(
    "transformers", reason="the Hugging Face cache needs transformers (pip install 'rankzoo[hf]')")

def reference_logits(saved, ids: torch.Tensor) -> torch.Tensor:
    """The logits of the saved weights in one parallel pass, no cache: the model compress
    measured (its projections are in the weights)."""
    with torch.no_grad():
        if saved.kind == "zoo":
            return saved.model(ids).float()
        return saved.model(input_ids=ids, use_cache=False).logits.float()


# ---------------------------------------------------------------- the codec

def test_codes_rebuild_the_projection_and_rope_is_undone_exactly():
    """decode(encode(a)) is U_r E_r a per head; unrotate_half inverts a (scaled) RoPE."""
    g = torch.Generator().manual_seed(0)
    G, K, ranks = 3, 8, [2, 0, 5]
    U = [torch.randn(K, r, generator=g, dtype=torch.float64) for r in ranks]
    E = [torch.randn(r, K, generator=g, dtype=torch.float64) for r in ranks]
    codes = SlotCodes(U, E)
    a = torch.randn(2, G, 5, K, generator=g)
    c = codes.encode(a)
    assert c.shape == (2, 1, 5, sum(ranks))
    expected = torch.stack([a[:, h].double() @ (U[h] @ E[h]).T for h in range(G)], 1)
    assert torch.allclose(codes.decode(c, torch.float64), expected, atol=1e-5)
    x = torch.randn(2, G, 5, K, generator=g, dtype=torch.float64)
    angles = torch.rand(5, K // 2, generator=g, dtype=torch.float64) * 6
    cos, sin = (torch.cat((f(angles), f(angles)), -1) * 1.3 for f in (torch.cos, torch.sin))
    x1, x2 = x.chunk(2, -1)
    y = x * cos + torch.cat((-x2, x1), -1) * sin
    assert torch.allclose(unrotate_half(y, cos, sin), x, atol=1e-12)
    # the zoo's own rotation at an offset, undone
    from train.commands.compress.target.cache import zoo_unrotate

    assert torch.allclose(zoo_unrotate(apply_rope(x, 7, 100.0), 7, 100.0), x, atol=1e-12)


def test_codes_refuse_heads_that_do_not_pair():
    with pytest.raises(ValueError, match=r"head 0: decoder \(8, 2\) and encoder \(3, 8\)"):
        SlotCodes([torch.zeros(8, 2)], [torch.zeros(3, 8)], "layer 0.k")


# ---------------------------------------------------------------- a zoo model

@pytest.mark.parametrize("variant", ["mha", "gqa-norope"])
def test_a_saved_zoo_model_holds_its_bytes_and_gives_the_measured_logits(zoo_run, tmp_path,
                                                                         variant):
    """Decoding through the low-rank cache holds exactly bytes_per_token x T at fp32, and
    its logits are the parallel forward's of the weights compress measured."""
    out = tmp_path / "saved"
    doc = compress_run(zoo_run / variant, CompressOptions(ratios=(2,), tolerance=10,
                                                      cache_dtype="fp32", save=str(out)))
    check = doc["saved"]["cache"]
    assert check["held_bytes"] == check["reported_bytes"] > 0
    assert check["max_logit_error"] < 1e-4 * max(1.0, check["logit_scale"])
    saved = load_compressed(out)
    assert saved.kind == "zoo" and saved.bytes_per_token == doc["rows"][doc["saved"]["row"]][
        "bytes_per_token"]
    ids = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(3))
    logits, cache = saved.decode(ids, prefill=3)
    assert held_bytes(cache) == saved.bytes_per_token * ids.numel()
    assert torch.allclose(logits, reference_logits(saved, ids), atol=1e-4)
    # the codes are narrower than the keys: a full KV cache holds `ratio` times the bytes
    full, ratio = doc["rows"][0]["bytes_per_token"], doc["saved"]["ratio"]
    assert held_bytes(cache) * ratio == pytest.approx(full * ids.numel()) and ratio >= 2


def test_a_windowed_zoo_model_is_saved_but_its_cache_refused_in_a_note(zoo_run, tmp_path):
    notes: list[str] = []
    doc = compress_run(zoo_run / "window", CompressOptions(ratios=(2,), tolerance=10,
                                                       save=str(tmp_path / "s")), notes=notes)
    assert doc["saved"]["cache"] is None
    assert any("a window's ring is not served yet" in n for n in notes)


# ---------------------------------------------------------------- Hugging Face models

@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_saved_hf_model_holds_its_bytes_through_generate(trained_llama, word_texts, tmp_path,
                                                           capsys, dtype):
    """The CLI saves, says what the cache held; loaded back, transformers' own generate
    runs on the low-rank cache and agrees with the loader's greedy loop; fp32 codes give
    the measured model's logits, bf16 codes hold half the bytes."""
    calib, evals = word_texts
    out = tmp_path / "s"
    code = main(["compress", "--hf", str(trained_llama), "--text", str(calib), "--eval-text",
                 str(evals), "--seq-len", "32", "--ratios", "2", "--tolerance", "10",
                 "--cache-dtype", dtype, "--save", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "its low-rank cache held" in err and "as the row counts" in err
    info = json.loads((out / "compress.json").read_text())
    assert info["rope"] and info["keys"] == "pre-rope"
    saved = load_compressed(out)
    ids = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(5))
    check = measure_saved(saved, ids, reference_logits(saved, ids))
    assert check["held_bytes"] == check["reported_bytes"] == info["row"]["bytes_per_token"] * 24
    assert check["max_logit_error"] < (1e-4 if dtype == "fp32" else 0.1)
    assert abs(check["delta_loss"]) < (1e-5 if dtype == "fp32" else 1e-2)
    prompt = ids[:, :6]
    ours = saved.generate(prompt, 8)
    theirs = saved.model.generate(prompt, **{saved.cache_kwarg: saved.new_cache()},
                                  max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert torch.equal(ours, theirs)


def test_a_fused_projection_without_rope_is_served(word_texts, tmp_path):
    """GPT-2: keys and values from one fused Conv1D, no RoPE; codes of the keys as cached."""
    from train.commands.compress import compress_hf

    torch.manual_seed(1)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64,
                                     n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    doc = compress_hf(tmp_path / "gpt2", *word_texts, CompressOptions(
        ratios=(2,), tolerance=10, cache_dtype="fp32", save=str(tmp_path / "s")), seq_len=32)
    check = doc["saved"]["cache"]
    assert check["held_bytes"] == check["reported_bytes"] and not doc["rope"]
    assert check["max_logit_error"] < 1e-4


def test_weights_that_are_not_the_bases_are_refused_in_one_line(trained_llama, word_texts,
                                                                tmp_path):
    """Bases saved beside other weights: the first keys decoded are not in their span."""
    from train.commands.compress import compress_hf

    out = tmp_path / "s"
    compress_hf(trained_llama, *word_texts,
                CompressOptions(ratios=(2,), tolerance=10, save=str(out)), seq_len=32)
    bases = torch.load(out / "bases.pt")
    bases["bases"]["0.k"] = [torch.linalg.qr(torch.randn(u.shape[0], u.shape[1]))[0]
                             for u in bases["bases"]["0.k"]]
    bases["encoders"]["0.k"] = None
    torch.save(bases, out / "bases.pt")
    saved = load_compressed(out)
    with pytest.raises(ValueError, match="layer 0.k: the keys turned back by their RoPE "
                                         "angles do not lie in the span of the saved bases"):
        saved.decode(torch.randint(0, 64, (1, 8)))


def test_a_directory_that_is_no_saved_model_is_one_line(tmp_path, trained_llama):
    with pytest.raises(FileNotFoundError, match="no compress.json or bases.pt"):
        load_compressed(trained_llama)
    with pytest.raises(FileNotFoundError, match="no compress.json or bases.pt"):
        load_compressed(tmp_path)


def test_a_setting_read_through_windows_is_not_saved(tmp_path):
    """The verdict's setting reads a KV head through a window (a mask, not weights): the
    largest low-rank setting within the tolerance is saved instead, or nothing, said."""
    from train.commands.compress.saved.save import save_compressed

    window = [{"layer": 0, "kv_head": 1, "window": 16, "sinks": 4}]
    doc = {"verdict": {"largest_ratio_within": 3.0, "largest_within": "mixed for 3x"},
           "rows": [{"allocation": "full", "ratio": 1.0, "delta_loss": 0.0},
                    {"allocation": "mixed", "ratio": 3.0, "delta_loss": 0.01,
                     "windows": window}]}
    notes: list[str] = []
    written: list = []
    save_compressed(doc, None, None, {}, CompressOptions(save=str(tmp_path / "s")), notes,
                    written.append)
    assert doc["saved"] is None and not written and not (tmp_path / "s").exists()
    assert "mixed for 3x reads KV heads through windows" in notes[0]
    assert "no low-rank setting is within" in notes[0]
