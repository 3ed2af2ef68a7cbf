"""Rank-budget reports on Hugging Face causal LMs saved in a local directory.

    report = hf_report("models/tiny-llama", "corpus.txt", seq_len=128, probe_size=4)
    rich.print(budgets.render_table(report))         # the report machinery, unchanged

The model is loaded offline (local_files_only, HF_HUB_OFFLINE) with the eager attention
path, the only one that returns the softmax probabilities. One forward pass over a probe
batch [B, T] of the text gives, per layer, what a zoo block's probe methods give:

  attentions      [B, H, T, T]   -> mixing, mixing_centered, past_future   (per head)
  attention input [B, T, D]      -> hidden_centered  (what the layer's attention reads)
  cache k, v      [B, G, T, K]   -> inference.k, inference.v  (joint over KV heads, [B, T, G*K])
  weights         W_Q^h W_K^h^T [D, D] per head -> qk; W_V^T [D, G*V] -> value; W_O -> out

against caps declared from the config alone (n_heads, head_dim, n_kv_heads, hidden size,
seq len), exactly as zoo's softmax block declares them. The entries have probe_model's
format, so build_report, render_table, to_json, verdicts and advice work unchanged.

Architectures differ only in where the projections live: LAYOUT_OF maps a config's
model_type to a layout, EXTRACTORS maps a layout to a function returning each layer's
projections in nn.Linear's (out, in) convention. transformers is imported lazily.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich import box
from rich.table import Table
from torch import nn

from .adapters import lowrank_singular_values
from .budget import RankBudget
from .metrics import _check_eps
from .probes import (
    _measure,
    add_adapters,
    final_hidden_metrics,
    measure_mixing,
    summarize_spectrum,
)
from .report import build_report

INSTALL_HINT = "pip install 'rankzoo[hf]'"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
ERANK_QUANTITIES = ("mixing", "mixing_centered", "past_future", "hidden_centered")


# ---------------------------------------------------------------- layouts

@dataclass(frozen=True)
class AttnWeights:
    """One layer's attention projections, each [out, in] like nn.Linear.weight."""

    wq: torch.Tensor  # [H*K, D]
    wk: torch.Tensor  # [G*K, D]
    wv: torch.Tensor  # [G*V, D]
    wo: torch.Tensor  # [D, H*V]


def _llama_weights(model) -> list[tuple[nn.Module, AttnWeights]]:
    # Llama, Mistral, Qwen2: separate q/k/v/o Linear layers; GQA via fewer k/v rows.
    return [(a, AttnWeights(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight))
            for a in (layer.self_attn for layer in model.base_model.layers)]


def _gpt2_weights(model) -> list[tuple[nn.Module, AttnWeights]]:
    # GPT-2's Conv1D stores its weight as [in, out]; c_attn fuses q, k and v along out.
    out = []
    for a in (block.attn for block in model.base_model.h):
        wq, wk, wv = a.c_attn.weight.T.chunk(3, dim=0)  # each [D, D]
        out.append((a, AttnWeights(wq, wk, wv, a.c_proj.weight.T)))  # wo: [D, H*V]
    return out


# layout -> (attention module, its projections) per layer, in layer order
EXTRACTORS: dict[str, Callable[[nn.Module], list[tuple[nn.Module, AttnWeights]]]] = {
    "llama": _llama_weights,
    "gpt2": _gpt2_weights,
}
# model types with Llama's layout (their extras, e.g. Qwen3's q/k norms or Gemma 2's logit
# soft-capping, shape the attention probabilities, which are measured as the model made them)
LAYOUT_OF = {**dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe",
                              "gemma", "gemma2", "olmo2", "granite"), "llama"),
             "gpt2": "gpt2"}


def layout_of(model_type: str, where: Path | str = "") -> str:
    if model_type not in LAYOUT_OF:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(LAYOUT_OF))}")
    return LAYOUT_OF[model_type]


@dataclass(frozen=True)
class Geometry:
    """The attention shape of a config: the letters of DESIGN.md."""

    model_type: str
    n_layers: int  # L
    n_heads: int  # H
    n_kv_heads: int  # G
    head_dim: int  # K (= V for every supported layout)
    d_model: int  # D
    max_len: int | None  # the longest sequence the position embedding covers

    @classmethod
    def from_config(cls, config) -> Geometry:
        # GPT2Config maps these standard names onto n_head, n_embd, n_layer, n_positions.
        H, D = int(config.num_attention_heads), int(config.hidden_size)
        return cls(model_type=config.model_type, n_layers=int(config.num_hidden_layers),
                   n_heads=H, n_kv_heads=int(getattr(config, "num_key_value_heads", None) or H),
                   head_dim=int(getattr(config, "head_dim", None) or D // H), d_model=D,
                   max_len=getattr(config, "max_position_embeddings", None))

    def check(self, i: int, w: AttnWeights) -> None:
        H, G, K, D = self.n_heads, self.n_kv_heads, self.head_dim, self.d_model
        want = {"wq": (H * K, D), "wk": (G * K, D), "wv": (G * K, D), "wo": (D, H * K)}
        for name, shape in want.items():
            got = tuple(getattr(w, name).shape)
            if got != shape:
                raise ValueError(f"layer {i}: {name} has shape {got}, but the config "
                                 f"(H={H}, G={G}, K={K}, D={D}) implies {shape}")


def _window(config, i: int) -> int | None:
    """Layer i's sliding window W (keys including the query), or None for full attention."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types and i < len(types):  # transformers >= 4.53 names each layer's attention
        return window if types[i] == "sliding_attention" else None
    return window if getattr(config, "use_sliding_window", True) else None


def declared_budget(g: Geometry, seq_len: int, window: int | None, params: int) -> RankBudget:
    """The caps of one layer, as zoo's softmax / sliding_window blocks declare them."""
    H, G, K, D, T = g.n_heads, g.n_kv_heads, g.head_dim, g.d_model, seq_len
    span = T if window is None else min(window, T)  # keys a query can see, at most
    return RankBudget(
        block=g.model_type, seq_len=T, n_heads=H,
        mixing=T // 2 if window is None else min(window - 1, T // 2),
        logits=K,
        value_path=min(D, G * K),
        inference=min(span, G * K),
        params=params,
        cache_elements=2 * span * G * K,
        flops_per_token=2 * D * (2 * H * K + 2 * G * K) + 2 * H * 2 * K * (span + 1) // 2,
    )


# ---------------------------------------------------------------- loading

def _transformers():
    """Import transformers offline; a clear error naming the extra when it is missing."""
    # Nothing is downloaded at run time: the hub client reads these when first imported.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import transformers
    except ImportError as e:
        raise ValueError(f"reading Hugging Face models needs transformers, which is not "
                         f"installed ({e}): {INSTALL_HINT}") from None
    return transformers


class _Quiet:
    """Silence transformers' progress bars and warnings, restoring them afterwards."""

    def __init__(self, transformers):
        self.log = transformers.utils.logging

    def __enter__(self):
        self.verbosity, self.bars = self.log.get_verbosity(), self.log.is_progress_bar_enabled()
        self.log.set_verbosity_error()
        self.log.disable_progress_bar()

    def __exit__(self, *exc):
        self.log.set_verbosity(self.verbosity)
        if self.bars:
            self.log.enable_progress_bar()


def model_type_of(path: Path) -> str:
    """model_type from PATH/config.json, checking the directory before transformers loads."""
    if not path.exists():
        raise FileNotFoundError(f"--hf {path}: model directory not found")
    if not path.is_dir():
        raise ValueError(f"--hf {path}: not a directory (expected one written by "
                         f"save_pretrained)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"--hf {path}: no config.json in it (expected a directory "
                                f"written by save_pretrained)")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config_file}: not a JSON document ({e})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"{config_file}: no model_type in it")
    return str(config["model_type"])


def load_model(path) -> tuple[nn.Module, object | None]:
    """(model in fp32 eval mode, tokenizer or None) from a save_pretrained directory."""
    path = Path(path)
    model_type = model_type_of(path)
    layout_of(model_type, path)  # unsupported: fail before loading any weights
    transformers = _transformers()
    with _Quiet(transformers):
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path, local_files_only=True, attn_implementation="eager")
        # transformers raises OSError, ValueError, safetensors' own errors and more for
        # corrupt or missing files: every one of them means "this directory does not load".
        except Exception as e:
            raise ValueError(f"--hf {path}: the {model_type} model does not load "
                             f"({type(e).__name__}: {e})") from None
        tokenizer = _load_tokenizer(transformers, path)
    # fp32: bf16 singular values below ~1e-2 s_1 are noise (notes/rank-science.md).
    return model.float().eval(), tokenizer


def adapter_dir(adapter) -> Path:
    """`adapter` as a Path, checked to hold a saved PEFT adapter."""
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"--adapter {adapter}: no adapter_config.json there (a "
                                "directory written by a PEFT model's save_pretrained)")
    return adapter


def load_adapter(model: nn.Module, adapter) -> nn.Module:
    """The model with a PEFT LoRA adapter saved in `adapter` applied (layers wrapped in
    place; the returned module is the transformers model, so everything else reads it as
    before). The adapter's ranks go on the report's adapter axis."""
    adapter = adapter_dir(adapter)
    try:
        import peft
    except ImportError:
        raise ValueError("--adapter needs PEFT: pip install 'rankzoo[peft]'") from None
    try:
        with warnings.catch_warnings():  # library deprecation chatter, not the user's concern
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = peft.PeftModel.from_pretrained(model, adapter, is_trainable=False)
    except Exception as e:  # as for the model: any failure means it does not load here
        raise ValueError(f"--adapter {adapter}: the adapter does not load onto the model "
                         f"({type(e).__name__}: {e})") from None
    return wrapped.get_base_model().float().eval()


def _load_tokenizer(transformers, path: Path):
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # as above: any failure means the saved tokenizer is unusable
        raise ValueError(f"--hf {path}: the tokenizer saved there does not load "
                         f"({type(e).__name__}: {e})") from None


# ---------------------------------------------------------------- the probe batch

def read_text(text) -> bytes:
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"--text {path}: file not found")
    if not path.is_file():
        raise ValueError(f"--text {path}: not a file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"--text {path}: the file is empty")
    return data


def token_ids(data: bytes, tokenizer, vocab_size: int, where: str = "") -> torch.Tensor:
    """Token ids [N] of the text: the model's tokenizer, else bytes modulo the vocab size."""
    if tokenizer is None:
        _note(f"{where}: no tokenizer saved with the model; using raw bytes modulo the "
              f"vocab size ({vocab_size}) as token ids")
        return torch.tensor(list(data), dtype=torch.long) % vocab_size  # [N]
    text = data.decode("utf-8", errors="replace")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise ValueError(f"{where}: the tokenizer gives id {int(ids.max())}, outside the "
                         f"model's vocab of {vocab_size}")
    return ids  # [N]


def check_seq_len(seq_len: int, g: Geometry) -> None:
    if g.max_len is not None and seq_len > g.max_len:
        raise ValueError(f"--seq-len {seq_len} exceeds the {g.model_type} model's "
                         f"max_position_embeddings ({g.max_len})")


def probe_batch(ids: torch.Tensor, seq_len: int, probe_size: int, where: str = ""
                ) -> torch.Tensor:
    """The first probe_size * seq_len tokens as [B, T] (contiguous, non-overlapping)."""
    need = probe_size * seq_len
    if ids.numel() < need:
        raise ValueError(f"--text {where}: too short for the probe batch: {ids.numel()} "
                         f"tokens, but --probe-size {probe_size} x --seq-len {seq_len} "
                         f"needs {need}")
    return ids[:need].view(probe_size, seq_len)  # [B, T]


def _note(message: str) -> None:
    print(f"rankzoo: note: {message}", file=sys.stderr)


# ---------------------------------------------------------------- measuring

def _kv_pairs(out) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (k, v) [B, G, T, K] from the forward's cache, across transformers versions."""
    cache = out.get("cache")  # transformers 5 renamed past_key_values to cache
    if cache is None:
        cache = out.get("past_key_values")
    if hasattr(cache, "layers"):  # DynamicCache, transformers >= 4.54
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):  # DynamicCache before that
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return [(kv[0], kv[1]) for kv in cache]  # the legacy tuple of (k, v) per layer


def weight_quantities(w: AttnWeights, g: Geometry, eps: float) -> dict:
    H, G, K, D = g.n_heads, g.n_kv_heads, g.head_dim, g.d_model
    wq = w.wq.detach().float().view(H, K, D)  # [H, K, D]
    # query head h reads KV head h // (H / G), as HF's repeat_kv arranges them
    wk = w.wk.detach().float().view(G, K, D).repeat_interleave(H // G, dim=0)  # [H, K, D]
    # W_Q^h W_K^h^T is D x D of rank <= K: its singular values are those of a K x K core
    s = lowrank_singular_values(wq.transpose(1, 2), wk)  # [H, K]
    return {
        "qk": summarize_spectrum(s, (D, D), eps),
        "value": _measure(w.wv.detach().float().T, eps),  # [D, G*V]
        "out": _measure(w.wo.detach().float(), eps),  # [D, H*V]
    }


@contextlib.contextmanager
def _attention_inputs(modules: list[nn.Module]):
    """Collect the hidden states [B, T, D] each attention module is called with."""
    seen: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"]).detach())

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _joint(kv: torch.Tensor) -> torch.Tensor:
    B, G, T, K = kv.shape
    return kv.float().transpose(1, 2).reshape(B, T, G * K)  # [B, T, G*K], as zoo caches it


def _layer_entry(i: int, name: str, g: Geometry, config, w: AttnWeights, params: int,
                 P: torch.Tensor, x: torch.Tensor, kv, eps: float) -> dict:
    g.check(i, w)
    T = P.shape[-1]
    measured = measure_mixing(P.float(), eps)  # P: [B, H, T, T]
    measured["hidden_centered"] = _measure(x.float(), eps, center=True, batch_dims=1)
    measured.update(weight_quantities(w, g, eps))
    measured["inference.k"] = _measure(_joint(kv[0]), eps, batch_dims=1)
    measured["inference.v"] = _measure(_joint(kv[1]), eps, batch_dims=1)
    return {
        "layer": i, "name": name, "block": g.model_type,
        "budget": declared_budget(g, T, _window(config, i), params).to_dict(),
        "quantities": {q: m for q, (m, _) in measured.items()},
        "spectra": {q: s for q, (_, s) in measured.items()},
    }


def probe_hf_model(model, ids: torch.Tensor, eps: float = 0.1,
                   with_spectra: bool = False) -> tuple[dict, float]:
    """(probe in probe_model's format, mean next-token loss) of a loaded HF model on ids [B, T]."""
    _check_eps(eps)
    config = model.config
    g = Geometry.from_config(config)
    layout = layout_of(g.model_type, type(model).__name__)
    attention = EXTRACTORS[layout](model)
    names = {m: n for n, m in model.named_modules()}
    with torch.no_grad(), _attention_inputs([m for m, _ in attention]) as inputs:
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True,
                    use_cache=True)
        if out.get("attentions") is None or any(a is None for a in out["attentions"]):
            raise ValueError(f"{g.model_type}: the model returned no attention probabilities "
                             f"(attn_implementation={config._attn_implementation!r}, "
                             f"need 'eager')")
        logits = out["logits"].float()  # [B, T, vocab]
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        layers = []
        # what each attention module read (after its layer's pre-norm), as zoo probes it
        for i, ((module, w), P, x, kv) in enumerate(zip(
                attention, out["attentions"], inputs, _kv_pairs(out), strict=False)):
            params = sum(p.numel() for p in module.parameters())
            layer = _layer_entry(i, names[module], g, config, w, params, P, x, kv, eps)
            # LoRA pairs anywhere in the decoder layer (attention or MLP), if an adapter
            # was loaded; rows are named relative to the layer (self_attn.q_proj, ...)
            add_adapters(layer, model.get_submodule(names[module].rpartition(".")[0]), eps)
            if not with_spectra:
                del layer["spectra"]
            layers.append(layer)
    if len(layers) != g.n_layers:
        raise ValueError(f"{g.model_type}: measured {len(layers)} layers, but the config "
                         f"declares num_hidden_layers={g.n_layers}")
    probe = {"seq_len": int(ids.shape[1]), "eps": float(eps), "layers": layers,
             # the last entry is the final norm's output, what the LM head reads
             "final_hidden": final_hidden_metrics(out["hidden_states"][-1], eps)}
    return probe, float(loss)


# ---------------------------------------------------------------- the report

def probe_hf(path, text, seq_len: int = 128, probe_size: int = 4, eps: float = 0.1,
             with_spectra: bool = False, adapter=None) -> tuple[str, dict]:
    """(variant name, build_report entry) of the model saved in `path` (with the PEFT
    adapter saved in `adapter` applied, if given), probed on `text`."""
    path = Path(path)
    data = read_text(text)  # cheap checks first: a bad --text costs no model load
    if adapter is not None:
        adapter = adapter_dir(adapter)  # a bad --adapter costs no model load either
    model, tokenizer = load_model(path)
    if adapter is not None:
        model = load_adapter(model, adapter)
    g = Geometry.from_config(model.config)
    check_seq_len(seq_len, g)
    ids = token_ids(data, tokenizer, int(model.config.vocab_size), str(text))
    batch = probe_batch(ids, seq_len, probe_size, str(text))  # [B, T]
    probe, loss = probe_hf_model(model, batch, eps, with_spectra)
    source = {"hf": str(path), "model_type": g.model_type, "text": str(text),
              "tokens": "tokenizer" if tokenizer is not None else "bytes % vocab_size",
              "probe_size": probe_size, "seq_len": seq_len,
              **({"adapter": str(adapter)} if adapter is not None else {})}
    entry = {"probe": probe, "step": 0, "params": sum(p.numel() for p in model.parameters()),
             "metrics": {"probe/loss": loss}, "source": source}
    return path.resolve().name or g.model_type, entry


def build_hf_report(name: str, entry: dict, thresholds=None) -> dict:
    """build_report of one HF variant, plus per-head eranks and the probe's source."""
    source = entry["source"]
    report = build_report({name: entry}, experiment=f"{name} ({source['model_type']})",
                          thresholds=thresholds)
    report["source"] = source
    for layer, probed in zip(report["variants"][0]["layers"], entry["probe"]["layers"],
                             strict=True):
        eranks = {q: probed["quantities"][q]["erank"] for q in ERANK_QUANTITIES}
        layer["erank"] = eranks  # per head (hidden_centered: one value per layer)
    return report


def hf_report(path, text, seq_len: int = 128, probe_size: int = 4, eps: float = 0.1,
              thresholds=None, adapter=None) -> dict:
    """The rank-budget report (schema rankzoo.report) of a saved HF causal LM on a text,
    with a PEFT LoRA adapter applied if `adapter` names one."""
    name, entry = probe_hf(path, text, seq_len, probe_size, eps, adapter=adapter)
    return build_hf_report(name, entry, thresholds)


def _mean(xs) -> float:
    return sum(xs) / len(xs)


HF_COLUMNS = ("layer", "hidden erank Hc", "mixing erank P", "erank Pc", "past->future erank")


def _hf_rows(report: dict):
    for layer in report["variants"][0]["layers"]:
        e = layer["erank"]
        yield (str(layer["layer"]), f"{layer['hidden_centered_erank']:.2f}",
               f"{_mean(e['mixing']):.2f}", f"{_mean(e['mixing_centered']):.2f}",
               f"{_mean(e['past_future']):.2f}")


def render_hf_table(report: dict) -> Table:
    """Per layer: erank of the centered hidden states, and raw/centered mixing eranks."""
    v, src = report["variants"][0], report["source"]
    table = Table(title=f"{v['variant']}: effective ranks per layer (means over heads)",
                  caption=f"probe: {src['probe_size']} x {src['seq_len']} tokens of "
                          f"{src['text']} ({src['tokens']}); next-token loss "
                          f"{v['metrics']['probe/loss']:.3f}; Hc = hidden states the "
                          f"attention reads, centered over tokens; Pc = centered attention",
                  box=box.SIMPLE_HEAD)
    for col in HF_COLUMNS:
        table.add_column(col, justify="right")
    for row in _hf_rows(report):
        table.add_row(*row)
    return table


def hf_markdown(report: dict) -> str:
    lines = ["## Effective ranks per layer (means over heads)", "",
             "| " + " | ".join(HF_COLUMNS) + " |", "|" + "|".join("---" for _ in HF_COLUMNS) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _hf_rows(report)]
    return "\n".join(lines) + "\n"
