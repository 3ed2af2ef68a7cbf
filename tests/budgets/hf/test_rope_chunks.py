"""RoPE however a model writes it, and chunked attention (budgets/capture/rope.py,
budgets/capture/masks.py, budgets/hf/capture.py) on llama4_text (chunks of 16 on layers 0-2,
NoPE on layer 3, RoPE by complex multiplication before a weightless norm), gemma4_text
(RoPE one tensor at a time on [B, T, H, K]) and longcat_flash (MLA whose interleaved RoPE
writes its output de-interleaved; two sublayers per decoder layer), built offline by
tests/hf_tiny.py: per layer P is eager attention's, the labels say what each layer does,
a chunked layer's past->future cap is what its mask allows and holds, and the CLI reads
each in one go."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers",
                    reason="the HF probe needs transformers (pip install 'rankzoo[hf]')")

import budgets  # noqa: E402
from budgets.capture.attention import AttentionCall, attend  # noqa: E402
from budgets.capture.masks import Band, mask_band  # noqa: E402
from budgets.capture.rope import before_rope  # noqa: E402
from budgets.hf.capture import capture  # noqa: E402
from budgets.hf.probe import probe_hf_model  # noqa: E402
from budgets.rank.matfree import operator_metrics  # noqa: E402
from tests.hf_tiny import VOCAB, tiny_model  # noqa: E402
from train.cli import main  # noqa: E402

TYPES = ("llama4_text", "gemma4_text", "longcat_flash")
B, T, C = 2, 64, 16  # llama4's chunks of 16: T / 2 = 32 is a chunk boundary
# the kind each layer reads as, by the model's own number
LABELS = {
    "llama4_text": ["chunked C=16"] * 3 + ["global no RoPE"],
    "gemma4_text": ["sliding W=8", "global"],
    "longcat_flash": ["global"] * 4,
}


def _ids(T: int = T, B: int = B) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module", params=TYPES)
def fp64(request):
    return tiny_model(request.param, fp64=True)


@pytest.fixture(scope="module")
def captured(fp64):
    """(eager attentions, eager logits, the captured calls, captured logits) on one batch."""
    with torch.no_grad():
        eager = fp64(input_ids=_ids(), output_attentions=True)
        calls: list[AttentionCall] = []
        with capture(fp64, calls.append, keep_probs=True):
            logits = fp64(input_ids=_ids()).logits
    return eager.attentions, eager.logits, calls, logits


def test_each_layers_p_is_eager_attentions_in_fp64(captured):
    """Per layer, the P the capture computes is the one eager attention returns (in fp64:
    eager's own softmax runs in fp32 for most types, llama4's in fp64, so 1e-6), and the
    model's output is unchanged."""
    eager, eager_logits, calls, logits = captured
    assert len(calls) == len(eager)
    torch.testing.assert_close(logits, eager_logits, rtol=0, atol=1e-6)
    for call, P in zip(calls, eager, strict=True):
        assert call.probs.dtype == torch.float64
        assert float((call.probs - P).abs().max()) < 1e-6


def test_labels_say_what_each_layer_does(fp64):
    probe, _ = probe_hf_model(fp64, _ids(), eps=0.1)
    model_type = fp64.config.model_type
    got = {ly["layer"]: ly["kind"]["label"] for ly in probe["layers"]}
    assert got == dict(enumerate(LABELS[model_type]))
    for layer in probe["layers"]:
        kind = layer["kind"]
        # "no RoPE" only where no rotary function ran (llama4's NoPE layer); every rotation
        # of these models is recovered
        assert kind["rope"] == ("no RoPE" not in kind["label"])
        assert "not recovered" not in kind["label"]
        assert layer["kv_heads"]["rope"] == kind["rope"]  # keys before RoPE measured
    if model_type == "longcat_flash":  # each MLA sublayer once, numbered as the model does
        assert [(ly["layer"], ly["name"]) for ly in probe["layers"]] == [
            (2 * i + j, f"model.layers.{i}.self_attn.{j}") for i in (0, 1) for j in (0, 1)]


def _unit(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x / x.norm(dim=-1, keepdim=True)


def test_keys_before_rope_are_the_rotations_input(captured, fp64):
    """At position 0 RoPE turns by no angle: there the keys before it are the keys (up to
    the norm llama4 applies after it); past it the rotated columns differ. llama4's keys
    before RoPE are k_proj's output itself (the projections are found from them)."""
    _, _, calls, _ = captured
    for call in calls:
        if not call.rotated:
            assert call.key_pre is None and call.module.layer_idx == 3  # llama4's NoPE
            continue
        pre, key = _unit(call.key_pre), _unit(call.key)
        torch.testing.assert_close(pre[..., 0, :], key[..., 0, :], rtol=0, atol=1e-6)
        assert float((pre[..., 1:, :] - key[..., 1:, :]).abs().max()) > 1e-2  # turned
    if fp64.config.model_type == "llama4_text":
        x = {}
        hooks = [ly.self_attn.register_forward_pre_hook(
            lambda m, a, kw: x.__setitem__(m, a[0] if a else kw["hidden_states"]),
            with_kwargs=True) for ly in fp64.model.layers]
        calls = []
        with torch.no_grad(), capture(fp64, calls.append):
            fp64(input_ids=_ids())
        for h in hooks:
            h.remove()
        for call in calls[:3]:
            k = call.module.k_proj(x[call.module]).view(B, T, -1, call.key.shape[-1])
            torch.testing.assert_close(call.key_pre, k.transpose(1, 2), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- chunks

@pytest.mark.parametrize("seq_len", [40, 64, 16])
def test_chunked_caps_hold_and_are_what_the_mask_allows(seq_len):
    """llama4's chunked layers at T = 40 (T/2 = 20: 4 keys of its chunk reach 12 queries,
    cap 4), T = 64 (T/2 a chunk boundary: cap 0) and T = 16 (one chunk, the mask causal:
    chunked from the config, cap T/2 as global): the declared cap is past_future_cap's,
    the exact rank of each head's P[t:, :t] is that cap (the mask allows it, softmax fills
    it), and the realized rank_eps stays within it, matrix-free as exactly."""
    model = tiny_model("llama4_text", fp64=True)
    ids = _ids(seq_len)
    calls: list[AttentionCall] = []
    with torch.no_grad(), capture(model, calls.append, keep_probs=True):
        model(input_ids=ids)
    probe, _ = probe_hf_model(model, ids, eps=0.1)
    free, _ = probe_hf_model(model, ids, eps=0.1, matfree_from=16)
    cap = budgets.past_future_cap(seq_len, None, C)
    assert cap == {40: 4, 64: 0, 16: 8}[seq_len]
    h = seq_len // 2
    for call, layer in zip(calls[:3], probe["layers"][:3], strict=True):
        assert call.chunk == C and layer["kind"]["attention"] == "chunked"
        assert layer["budget"]["mixing"] == cap
        # the keys the last query saw, at most G * K = 32
        assert layer["budget"]["inference"] == min((seq_len - 1) % C + 1, 32)
        ranks = torch.linalg.matrix_rank(call.probs[..., h:, :h])  # [B, H]
        assert ranks.eq(cap).all()
        assert max(layer["quantities"]["past_future"]["rank_eps"]) <= cap
    for exact, matfree in zip(probe["layers"], free["layers"], strict=True):
        assert exact["kind"] == matfree["kind"]
        assert exact["quantities"]["past_future"]["rank_eps"] == \
            matfree["quantities"]["past_future"]["rank_eps"]
    global_layer = probe["layers"][3]
    assert global_layer["budget"]["mixing"] == h


def _chunked_mask(T: int, C: int, boolean: bool, batch: int = 1) -> torch.Tensor:
    t = torch.arange(T)
    seen = (t[None] <= t[:, None]) & (t[None] >= t[:, None] // C * C)  # [T, T]
    if boolean:
        return seen.expand(batch, 1, T, T)
    return torch.zeros(batch, 1, T, T, dtype=torch.float64).masked_fill(
        ~seen, torch.finfo(torch.float64).min)


@pytest.mark.parametrize("T_, C_", [(24, 7), (30, 5), (40, 16)])
@pytest.mark.parametrize("boolean", [False, True])
def test_a_hand_made_chunked_mask_is_read_and_its_cap_is_exact(T_, C_, boolean):
    """Any attention under a chunked mask (additive or boolean) reads as chunked C: its
    declared cap is past_future_cap's, each head's P[t:, :t] has exactly that rank, and the
    matrix-free operator gives the dense block's figures."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4 // n, T_, 8, generator=g, dtype=torch.float64)
               for n in (1, 2, 2))
    mask = _chunked_mask(T_, C_, boolean, batch=2)
    assert mask_band(mask, T_) == Band(chunk=C_)
    call = AttentionCall(torch.nn.Identity(), q, k, v, 0.5, chunk=mask_band(mask, T_).chunk,
                         mask=mask)
    attend(call, keep_probs=True)
    h = T_ // 2
    cap = call.caps(T_, 32, 0, "softmax").mixing
    lo = h // C_ * C_
    assert cap == min(h - lo, min(lo + C_, T_) - h)
    block = call.probs[..., h:, :h]  # [B, H, T - h, h]
    assert torch.linalg.matrix_rank(block).eq(cap).all()
    free = operator_metrics(call.operator().past_future(), eps=0.1)
    dense = budgets.rank_metrics(block.float(), eps=0.1)
    assert torch.equal(free["rank_eps"].double(), dense["rank_eps"].double())
    assert call.kind(False)["label"] == f"chunked C={C_} no RoPE"


def test_masks_that_are_not_a_band_read_as_none():
    T_ = 24
    mask = _chunked_mask(T_, 8, boolean=False, batch=2)
    padded = mask.clone()
    padded[1, :, :, 0] = torch.finfo(torch.float64).min  # a left-padded second row
    biased = mask.clone()
    biased[mask == 0] = -0.5  # ALiBi-like biases on the keys seen
    assert mask_band(padded, T_) is None and mask_band(biased, T_) is None
    t = torch.arange(T_)
    assert mask_band(t[None] <= t[:, None], T_) == Band()
    assert mask_band((t[None] <= t[:, None]) & (t[None] > t[:, None] - 5), T_) == Band(window=5)


class ChunkedAttention(torch.nn.Module):
    """Self-attention of one's own that passes SDPA a chunked boolean mask."""

    def __init__(self, D: int, H: int, C: int):
        super().__init__()
        self.H, self.C, self.qkv = H, C, torch.nn.Linear(D, 3 * D)

    def forward(self, x):
        B_, T_, D = x.shape
        t = torch.arange(T_)
        mask = (t[None] <= t[:, None]) & (t[None] >= t[:, None] // self.C * self.C)
        q, k, v = (a.view(B_, T_, self.H, -1).transpose(1, 2)
                   for a in self.qkv(x).split(D, dim=-1))  # [B, H, T, K] each
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.transpose(1, 2).reshape(B_, T_, D)


class ChunkedSDPA(torch.nn.Module):
    def __init__(self, D: int = 32, H: int = 4, C: int = 8, L: int = 2):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(VOCAB, D), torch.nn.Linear(D, VOCAB)
        self.layers = torch.nn.ModuleList(ChunkedAttention(D, H, C) for _ in range(L))

    def forward(self, ids):
        x = self.emb(ids)  # [B, T, D]
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def test_a_chunked_mask_through_sdpa_is_read_as_chunks_matrix_free_too():
    torch.manual_seed(0)
    model, ids = ChunkedSDPA().eval(), _ids(40)  # T/2 = 20: 4 keys of its chunk cross
    exact, _ = budgets.probe_torch_model(model, ids)
    free, _ = budgets.probe_torch_model(model, ids, matfree_from=16)
    assert "unread_calls" not in free
    for a, b in zip(exact["layers"], free["layers"], strict=True):
        assert a["kind"]["label"] == b["kind"]["label"] == "chunked C=8 no RoPE"
        assert a["budget"]["mixing"] == budgets.past_future_cap(40, None, 8) == 4
        assert a["quantities"]["past_future"]["rank_eps"] == \
            b["quantities"]["past_future"]["rank_eps"]


# ---------------------------------------------------------------- RoPE layouts

def _rope_angles(T_: int, r: int) -> torch.Tensor:
    inv = 1.0 / (100.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
    return torch.arange(T_, dtype=torch.float64)[:, None] * inv  # [T, r/2]


def test_rope_is_recovered_in_every_layout_or_said_not_to_be():
    """A hand-written rotation: interleaved pairs written de-interleaved on the last r of
    K columns (MLA), tokens-second [B, T, H, K] with a norm after it, and complex
    multiplication; each recovered as its input in the keys' own column order. A tensor
    that no recorded rotation made is None, never an error."""
    g = torch.Generator().manual_seed(0)
    Bq, H, T_, K, r = 2, 3, 12, 16, 8
    a = _rope_angles(T_, r)  # [T, r/2]
    cos, sin = a.cos(), a.sin()

    # MLA: a shared rotary key [B, 1, T, r], its pairs (x0, x1), ... written as (evens, odds)
    x = torch.randn(Bq, 1, T_, r, generator=g, dtype=torch.float64)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    nope = torch.randn(Bq, H, T_, K - r, generator=g, dtype=torch.float64)
    key = torch.cat([nope, out.expand(-1, H, -1, -1)], dim=-1)  # [B, H, T, K]
    pre = before_rope(key, [(x, out)])
    assert torch.equal(pre[..., :K - r], nope)
    torch.testing.assert_close(pre[..., K - r:], torch.cat([x1, x2], -1).expand(-1, H, -1, -1))

    # tokens second [B, T, H, K], then a weightless norm of each head's vector
    y = torch.randn(Bq, T_, H, K, generator=g, dtype=torch.float64)
    b = _rope_angles(T_, K)  # [T, K/2]
    half = torch.cat([b, b], -1)[:, None, :]  # [T, 1, K] rotate_half's angles
    turned = y * half.cos() + torch.cat([-y[..., K // 2:], y[..., :K // 2]], -1) * half.sin()
    normed = (turned / turned.pow(2).mean(-1, keepdim=True).sqrt()).transpose(1, 2)
    torch.testing.assert_close(before_rope(normed, [(y, turned)]), y.transpose(1, 2))

    # complex multiplication of interleaved pairs (llama4's freqs_cis), in place
    z = torch.randn(Bq, T_, H, K, generator=g, dtype=torch.float64)
    angles = _rope_angles(T_, K)
    w = torch.view_as_real(torch.view_as_complex(z.reshape(Bq, T_, H, K // 2, 2))
                           * torch.polar(torch.ones_like(angles), angles)[:, None]).flatten(3)
    torch.testing.assert_close(before_rope(w.transpose(1, 2), [(z, w)]), z.transpose(1, 2))

    # what no recorded rotation made: not recovered, no error
    other = torch.randn(Bq, H, T_, K, generator=g, dtype=torch.float64)
    assert before_rope(other, [(x, out), (y, turned), (z, w)]) is None
    assert before_rope(other, [(torch.randn(3, 5), torch.randn(3, 5))]) is None


def test_an_unrecovered_rotation_is_labelled_so():
    call = AttentionCall(torch.nn.Identity(), *(torch.randn(1, 2, 8, 4) for _ in range(3)),
                         0.5, rotated=True)
    kind = call.kind(False)
    assert kind["rope"] and kind["label"] == "global RoPE (keys before rotation not recovered)"


# ---------------------------------------------------------------- the CLI

@pytest.mark.parametrize("model_type", TYPES)
def test_the_cli_reads_each_type_in_one_go(saved, text_file, capsys, model_type):
    code = main(["report", "--hf", str(saved(model_type)), "--text", str(text_file),
                 "--seq-len", "64", "--probe-size", "1", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    layers = json.loads(out)["variants"][0]["layers"]
    assert {ly["layer"]: ly["kind"]["label"] for ly in layers} == dict(
        enumerate(LABELS[model_type]))
    for layer in layers:
        caps = {a["quantity"]: a["declared"] for a in layer["axes"]}
        kind = layer["kind"]
        assert caps["past_future"] == budgets.past_future_cap(64, kind["window"],
                                                              kind.get("chunk"))


def test_emit_mirrors_chunked_and_nope_layers(saved, text_file, capsys, tmp_path):
    """llama4's three chunked layers and its NoPE layer: softmax with `chunk` and with
    `rope: false`, a pattern that loads and dry-runs; chunks not shorter than the
    experiment's length are refused in one line, nothing written."""
    from train.config.load import load_experiment

    path = tmp_path / "mirror.yaml"
    args = ["report", "--hf", str(saved("llama4_text")), "--text", str(text_file),
            "--seq-len", "64", "--probe-size", "1", "--d-model", "64", "--n-heads", "4"]
    assert main([*args, "--emit", str(path)]) == 0
    capsys.readouterr()
    blocks = load_experiment(path).to_dict()["variants"]["pattern"]["blocks"]
    assert blocks["chunked"]["chunk"] == 16 and blocks["chunked"].get("rope", True)
    assert blocks["global"]["rope"] is False and "chunk" not in blocks["global"]
    assert main(["train", str(path), "--dry-run"]) == 0
    short = tmp_path / "short.yaml"
    assert main([*args, "--emit", str(short), "--train-seq-len", "16"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rankzoo: error")]
    assert len(lines) == 1 and "chunks of C=16" in lines[0] and not short.exists()


def test_a_config_whose_own_forward_fails_is_one_line(tmp_path, text_file, capsys):
    """longcat_flash saved with head_dim (its rotary width) 16 beside qk_rope_head_dim 8:
    transformers' own forward fails, capture or not; the CLI says so in one line."""
    tiny_model("longcat_flash", head_dim=16).save_pretrained(tmp_path / "bad")
    code = main(["report", "--hf", str(tmp_path / "bad"), "--text", str(text_file),
                 "--seq-len", "64", "--probe-size", "1", "--format", "json"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rankzoo: error")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert "longcat_flash: the model's own forward fails" in lines[0]
