"""A test fixture, not part of the product: every causal LM type the installed transformers
ships (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), built tiny from its config offline and run
through the rank-budget probe as `rankzoo report --hf` runs it. tests/budgets/hf/test_sweep.py
and benches/train/hf/bench_sweep.py share it.

    row = sweep_one("llama")    # Row(model_type, outcome, detail, seconds)

Each type ends in one of four outcomes:

  faithful  the probe ran, its captured forward's loss equal to the model's own (fp64), each
            captured P equal to eager attention's `output_attentions` (to 1e-6) where the
            model returns them, else each decoder layer's output under the capture equal to
            its plain output; every decoder layer measured or named as not measured
  refused   rankzoo refused in one line (a ValueError whose message is one line)
  skipped   not a tiny text causal LM to probe: its tiny config or model cannot be built,
            it is a multimodal wrapper or an encoder model, or it has no eager path
  broken    anything else: a traceback from rankzoo, a silent difference, a layer neither
            measured nor named (the test fails on these)
"""

from __future__ import annotations

import contextlib
import linecache
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from budgets.hf.capture import capture
from budgets.hf.geometry import Geometry
from budgets.hf.probe import _sources, build_hf_report, probe_hf_model
from tests.hf_tiny import MLA, MOE, VOCAB, tiny_config
from train.hf.model_dir import import_transformers, quiet
from train.hf.probe import runs_on_its_own

ROOT = Path(__file__).resolve().parents[1]  # rankzoo's checkout
B, T = 1, 16
P_TOLERANCE = 1e-6  # max |captured P - eager P|, fp64
OUTPUT_TOLERANCE = 1e-9  # max |captured - plain| of a decoder layer's output / its max, fp64

# sizes beside tests/hf_tiny.py COMMON for every type: few, small experts (the defaults,
# up to 64 experts of 1408 columns, would take most of the sweep's time)
SMALL = dict(MOE, n_routed_experts=4, moe_topk=2, shared_expert_intermediate_size=32,
             expert_ffn_hidden_size=32, ffn_hidden_size=128)
# model type -> config overrides where the generic sizes (tests/hf_tiny.py COMMON and its
# tables) fail, each with why
SWEEP = {
    # multi-head latent attention: its own head sizes (the generic head_dim 16 is not
    # qk_nope + qk_rope)
    "deepseek_v2": MLA, "minicpm3": MLA, "glm4_moe_lite": MLA, "sarvam_mla": MLA,
    "axk1": MLA, "axk2": MLA, "youtu": MLA,
    # Mamba-2 mixers of 8 heads of 16 channels, state 16 (the defaults, 128 heads of 64
    # and a state of 128-256, take seconds a forward)
    "nemotron_h": dict(mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=1,
                       chunk_size=16),
    "granitemoehybrid": dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
                             mamba_chunk_size=16),
    "zaya": dict(num_experts_per_tok=1),  # its config takes 1 only
    # configs that check their sizes against each other
    "dots3_note_text": dict(num_key_value_heads=4),
    "kolibri1_1": dict(index_num_heads=2),  # at most the query heads of a key head
    "dots1": dict(n_shared_experts=1),  # its default None is multiplied
    # a layer type per layer where the default lists a full-size model's
    "zamba2": dict(layer_types=["mamba", "hybrid"], mamba_d_state=16, mamba_headdim=16,
                   n_mamba_heads=8),
    # RoPE parameters per layer type, none by default
    "cohere_compass_text": dict(rope_parameters={"full_attention": dict(
        rope_type="default", rope_theta=10000.0)}),
    "lfm2_moe": dict(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                     num_dense_layers=1),
    "gemma3n_text": dict(num_kv_shared_layers=0),
    # BERT-style encoders: their causal-LM class asks for is_decoder (without it they attend
    # both ways, and the capture refuses is_causal=False in one line)
    **dict.fromkeys(("bert", "bert-generation", "camembert", "data2vec-text", "electra",
                     "ernie", "roberta", "roberta-prelayernorm", "roc_bert", "xlm-roberta",
                     "xlm-roberta-xl", "xmod"), dict(is_decoder=True)),
    # its LM head requires is_decoder; axial positions summing to D = 64, covering T = 16
    "reformer": dict(is_decoder=True, axial_pos_embds_dim=[32, 32], axial_pos_shape=[4, 4]),
    # a rotary width (default 64) wider than the heads of 16
    "codegen": dict(rotary_dim=8), "gptj": dict(rotary_dim=8),
    # FalconConfig derives head_dim: it has no setter
    "falcon": dict(head_dim=None),
    # attention_types must cover num_layers
    "gpt_neo": dict(num_layers=2, attention_types=[[["global", "local"], 1]]),
}
# model type -> why the sweep finds it broken and it is left so (each a known limitation of
# rankzoo's probe; the test fails when one of them starts to pass, to be moved out)
KNOWN = {
    "hrm_text": "two stacks of 2 layers called in 16 cycles: the report holds 4 of the 16 "
                "calls, and the second stack's layers are neither measured nor named",
}


@dataclass
class Row:
    model_type: str
    outcome: str  # faithful, refused, skipped, broken
    detail: str
    seconds: float = 0.0


def causal_lm_types() -> list[str]:
    """Every model type the installed transformers maps to a causal-LM class."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _first_line(e: BaseException) -> str:
    e = e.__cause__ or e  # a config validator's own error, not its wrapper's
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:160]


class _Skip(Exception):
    pass


def build(model_type: str) -> nn.Module:
    """The tiny fp64 eager model of `model_type`, or _Skip with why."""
    transformers = import_transformers()
    try:
        config = tiny_config(model_type, **{**SMALL, **SWEEP.get(model_type, {})})
    except Exception as e:  # noqa: BLE001 - whatever a config's checks raise
        raise _Skip(f"config: {_first_line(e)}") from None
    if getattr(config, "is_encoder_decoder", False):
        raise _Skip("encoder-decoder config")
    subs = [k for k in getattr(config, "sub_configs", {}) or {} if getattr(config, k, None)]
    if subs:
        raise _Skip(f"a wrapper of sub-configs ({', '.join(subs)}): multimodal or composite")
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", experts_implementation="eager")
    except Exception as e:  # noqa: BLE001
        text = _first_line(e)
        if "eager" in text:
            raise _Skip(f"no eager path: {text}") from None
        raise _Skip(f"model: {text}") from None
    return model.double().eval()


def _ids(model) -> torch.Tensor:
    vocab = int(getattr(model.config, "vocab_size", VOCAB) or VOCAB)
    return torch.randint(3, min(vocab, VOCAB), (B, T),
                         generator=torch.Generator().manual_seed(1))


def _decoder_layers(model: nn.Module) -> dict[str, nn.Module]:
    n = getattr(model.config, "num_hidden_layers", None)
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) == n:
            return {f"{name}.{i}": item for i, item in enumerate(m)}
    return {}


def _outputs(model, ids, layers: dict[str, nn.Module], under=None) -> dict[str, torch.Tensor]:
    from budgets.probe.faithful import _tensor
    seen: dict[str, torch.Tensor] = {}
    def hook(module, args, out, name):
        seen.setdefault(name, _tensor(out))  # returns None: the output goes on unchanged
    handles = [m.register_forward_hook(lambda mod, a, out, n=n: hook(mod, a, out, n))
               for n, m in layers.items()]
    try:
        with torch.no_grad():
            if under is None:
                model(input_ids=ids, use_cache=False)
            else:
                with under():
                    model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return seen


def _p_gap(call, eager: torch.Tensor) -> float:
    """max |P - eager P|; with sinks, the rows of P renormalized where eager returns its
    weights before the sink takes its share (granite_swa scales P V by the sink afterwards)."""
    gap = float((call.probs - eager).abs().max())
    if gap > P_TOLERANCE and call.sinks is not None:
        rows = call.probs / call.probs.sum(-1, keepdim=True)
        gap = min(gap, float((rows - eager).abs().max()))
    return gap


def _check_p(model, ids) -> tuple[str, str]:
    """(what differs or '', how it was compared): each captured P against eager attention's
    output_attentions, where the model returns one [B, H, T, T] per call; else each decoder
    layer's output under the captures against its plain output."""
    with torch.no_grad():
        eager = model(input_ids=ids, output_attentions=True, use_cache=False)
    attentions = [a for a in (getattr(eager, "attentions", None) or ()) if a is not None]
    calls = []
    with torch.no_grad(), capture(model, calls.append, keep_probs=True):
        model(input_ids=ids, use_cache=False)
    calls = [c for c in calls if getattr(c, "probs", None) is not None]
    if not calls and attentions:  # budgets/hf/eager.py: P is output_attentions itself
        return "", "P read from eager output_attentions (no attention interface)"
    if attentions and len(attentions) == len(calls) and all(
            a.shape == c.probs.shape for a, c in zip(attentions, calls, strict=True)):
        gap = max(_p_gap(c, a) for a, c in zip(attentions, calls, strict=True))
        how = f"P = eager P ({len(calls)} calls, max abs difference {gap:.0e})"
        return ("" if gap <= P_TOLERANCE else f"max |P - eager P| {gap:.2e}"), how
    layers = _decoder_layers(model)

    @contextlib.contextmanager
    def captured():
        with contextlib.ExitStack() as stack:
            for source in _sources(False):
                stack.enter_context(source(model, lambda call: None))
            yield
    plain, under = _outputs(model, ids, layers), _outputs(model, ids, layers, captured)
    worst = 0.0
    for name, out in plain.items():
        if out is None or name not in under or under[name] is None:
            continue
        rel = float((under[name] - out).abs().max()) / max(float(out.abs().max()), 1e-30)
        if rel > OUTPUT_TOLERANCE:
            return f"{name}'s output differs under the capture (relative {rel:.2e})", ""
        worst = max(worst, rel)
    return "", f"each layer's output unchanged by the capture (relative {worst:.0e})"


def _refused(e: BaseException) -> bool:
    """Whether rankzoo raised `e` on purpose: its last frame a `raise` in rankzoo's code,
    not Python's own ValueError from a line of rankzoo or of the model (an unpacking)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    path = Path(tb.tb_frame.f_code.co_filename)
    line = linecache.getline(str(path), tb.tb_lineno).strip()
    return ROOT in path.parents and "site-packages" not in path.parts and \
        line.startswith("raise")


def probe(model, ids) -> dict:
    """`rankzoo report --hf`'s path on a loaded model: the config's geometry, the model's
    own forward, the probe, the report."""
    g = Geometry.from_config(model.config)
    g.check_seq_len(T)
    runs_on_its_own(model, ids, g.model_type)
    found, loss = probe_hf_model(model, ids)
    entry = {"probe": found, "step": 0, "params": 0, "metrics": {"probe/loss": loss},
             "source": {"model_type": g.model_type}}
    build_hf_report(g.model_type, entry)
    return found


def sweep_one(model_type: str) -> Row:
    start = time.perf_counter()

    def row(outcome: str, detail: str) -> Row:
        return Row(model_type, outcome, detail, time.perf_counter() - start)

    transformers = import_transformers()
    with quiet(transformers), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = build(model_type)
        except _Skip as e:
            return row("skipped", str(e))
        ids = _ids(model)
        try:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
        except Exception as e:  # noqa: BLE001
            return row("skipped", f"tiny model's own forward fails: {_first_line(e)}")
        try:
            found = probe(model, ids)
        except ValueError as e:
            text = str(e)
            if "\n" in text.strip():
                return row("broken", f"a refusal of several lines: {_first_line(e)}")
            if not _refused(e):
                return row("broken", f"traceback: {_first_line(e)}")
            return row("refused", text)
        except Exception as e:  # noqa: BLE001
            return row("broken", f"traceback: {_first_line(e)}")
        n = int(model.config.num_hidden_layers)
        named = {m["layer"] for m in found.get("unmeasured_mixers", [])}
        measured = {ly["layer"] for ly in found["layers"]}
        missing = sorted(set(range(n)) - named - measured)
        if missing:
            return row("broken", f"layers {missing} neither measured nor named")
        try:
            gap, how = _check_p(model, ids)
        except Exception as e:  # noqa: BLE001
            return row("broken", f"checking P: {_first_line(e)}")
        if gap:
            return row("broken", f"silent difference: {gap}")
        return row("faithful", f"{len(measured)} of {n} layers measured, {how}" + (
            f"; {len(named)} named as not measured" if named else ""))


