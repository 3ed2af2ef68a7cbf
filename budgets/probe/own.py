"""The rank-budget probe of a model that is neither a zoo model nor a Hugging Face one:
any PyTorch module that attends through `F.scaled_dot_product_attention`.

    probe, loss = probe_torch_model(model, tokens)      # tokens: [B, T] token ids
    report = budgets.report_of_model(model, tokens, name="my-gpt")

One forward under the SDPA capture (budgets/capture/sdpa.py) gives, per attention call,
what `report --hf` gives per layer: P and its past->future rank per head, the logits' and
value path's ranks where the projections are found (budgets/capture/projections.py), the
keys and values per KV head, the caps of the call's shape; layers are the model's own
modules, named and ordered as its forward calls them. What cannot be read is named under
"unread_calls" (each SDPA call the capture could not read, with why) and
"unmeasured_mixers" (layers of the model's block list that made no SDPA call: a custom
kernel, or a mixer that is not attention), never dropped.

`forward(model, tokens)` is how the model is called (default `model(tokens)`); its output
may be the logits, a tuple whose first item is the logits (nanoGPT's (logits, loss)), or
an object with `.logits`. The captured forward's loss is checked against the model's own
(budgets/probe/faithful.py): a capture that changed the model is refused.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable

import torch
from torch import nn

from ..capture.projections import DISCOVERY_TOKENS, discover
from ..capture.sdpa import capture_sdpa
from ..rank.matfree import K_MAX
from ..rank.metrics import check_eps
from ..report.captured import captured_report
from .blocks import MATFREE_FROM, final_hidden_metrics, output_head
from .calls import CallProbe, probe_calls
from .entries import attention_entry
from .faithful import first_change, loss_check, replaying, rng_state
from .streams import MASSIVE_RATIO

BUILDERS = {"attention": attention_entry}
# a module named or typed like a token mixer (a block list's item holding one mixes tokens)
MIXER_WORDS = re.compile(r"attn|attention|mixer|mamba|ssm|conv|rnn|lstm|retention|delta|"
                         r"recurren|hyena|mamba", re.IGNORECASE)


def logits_of(out) -> torch.Tensor:
    """The logits [B, T, vocab] in what a model's forward returned."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, dict):
        logits = out.get("logits")
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"the model's forward returned {type(out).__name__}: no logits "
                         f"in it (a tensor, a tuple starting with one, or .logits)")
    return logits


def _call(model: nn.Module, tokens: torch.Tensor) -> object:
    return model(tokens)


def _layer_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """The model's lists of blocks: every non-empty ModuleList whose items are alike."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, nn.ModuleList) and len(m)
            and len({type(item) for item in m}) == 1]


def _mixes(item: nn.Module) -> bool:
    """Whether a block holds a module named or typed like a token mixer."""
    return any(MIXER_WORDS.search(f"{name} {type(m).__name__}")
               for name, m in item.named_modules())


def _silent_layers(model: nn.Module, measured: list[str]) -> list[dict]:
    """Items of the model's block lists that hold a token mixer (by its name or class)
    but made no call the capture read: named, never dropped."""
    out = []
    for list_name, items in _layer_lists(model):
        prefix = f"{list_name}." if list_name else ""
        if not any(m.startswith(prefix) for m in measured):
            continue  # a list of something else (experts, heads)
        for i, item in enumerate(items):
            here = any(m.startswith(f"{prefix}{i}.") or m == f"{prefix}{i}" for m in measured)
            if not here and _mixes(item):
                out.append({"model_type": type(model).__name__, "layer": i,
                            "name": f"{prefix}{i}", "class": type(item).__name__})
    return out


def probe_torch_model(model: nn.Module, tokens: torch.Tensor, eps: float = 0.1,
                      with_spectra: bool = False, *, layers: list[int] | None = None,
                      matfree_from: int | None = MATFREE_FROM, k_max: int = K_MAX,
                      forward: Callable[[nn.Module, torch.Tensor], object] = _call,
                      progress=None, massive_ratio: float = MASSIVE_RATIO
                      ) -> tuple[dict, float]:
    """(probe in probe_model's format, mean next-token loss) of `model` on tokens [B, T].
    `layers`: the layer numbers to measure (the model's: its block list's indices; None:
    all); from T >=
    matfree_from the mixing is measured matrix-free, as report --hf does."""
    check_eps(eps)
    T = int(tokens.shape[1])
    matfree = matfree_from is not None and matfree_from <= T
    block = type(model).__name__
    unread: list[str] = []

    @contextlib.contextmanager
    def source(m, on_call):
        with capture_sdpa(m, on_call, keep_probs=not matfree, matfree=matfree) as cap:
            yield cap
        unread.extend(cap.unread)

    with torch.no_grad():
        maps = discover(model, lambda: forward(model, tokens[:, :DISCOVERY_TOKENS]), source)
        if not maps:
            seen = f" (it saw: {'; '.join(sorted(set(unread)))})" if unread else ""
            raise ValueError(f"{block}: no F.scaled_dot_product_attention call the capture "
                             f"can read in its forward, so the probe cannot read it{seen}")
        unread.clear()  # the discovery pass's; the measuring pass names them again
        p = CallProbe(model, maps, eps, BUILDERS, block, layers, with_spectra, k_max,
                      progress, massive_ratio)
        state = rng_state()  # the plain forward replays the captured one's random draws
        final, logits = probe_calls(p, lambda: logits_of(forward(model, tokens)), [source],
                                    output_head(model), matfree)
        check = _loss_check(model, tokens, forward, logits, maps, matfree, state)
    probe = {"seq_len": T, "eps": float(eps), "batch_size": int(tokens.shape[0]),
             "layers": [p.layers[i] for i in p.wanted]}
    if final is not None:  # a model with a `head` or `lm_head`: its final hidden state
        probe["final_hidden"] = final_hidden_metrics(final, eps)
    if matfree:
        probe["matfree"] = {"from": matfree_from, "k_max": k_max}
    if unread:
        probe["unread_calls"] = sorted(set(unread))
    silent = _silent_layers(model, [m.name for m in maps])
    if silent:
        probe["unmeasured_mixers"] = silent
    probe["loss_check"] = check
    return probe, check["captured"]


def _loss_check(model: nn.Module, tokens: torch.Tensor, forward, logits: torch.Tensor,
                maps: list, matfree: bool, state: dict) -> dict:
    """The captured loss against the model's own on the same tokens (one more forward,
    drawing from the random `state` the captured one drew from; the calls' modules watched
    to name a change: budgets/probe/faithful.py)."""
    def run_plain():
        with replaying(state):
            return logits_of(forward(model, tokens))

    def run_captured():
        with replaying(state), capture_sdpa(model, lambda call: None,
                                            keep_probs=not matfree, matfree=matfree):
            return forward(model, tokens)

    first = {m.module: m.name for m in reversed(maps)}  # a module once, its first name
    dtype = next(model.parameters()).dtype
    return loss_check(_next_token_loss(logits, tokens), _next_token_loss(run_plain(), tokens),
                      dtype, lambda: first_change({n: m for m, n in first.items()}, run_plain,
                                                  run_captured, dtype))


def _next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> float:
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1),
                                                   tokens[:, 1:].flatten()))


def report_of_model(model: nn.Module, tokens: torch.Tensor, name: str | None = None,
                    source: dict | None = None, zoo_blocks=None, **options) -> dict:
    """The rank-budget report document of `model` on tokens [B, T] (`options`:
    probe_torch_model's; `source`: what the caller says of where the model and tokens came
    from), as `rankzoo report --model` prints it."""
    probe, loss = probe_torch_model(model, tokens, **options)
    name = name or type(model).__name__
    entry = {"probe": probe, "step": 0, "params": sum(q.numel() for q in model.parameters()),
             "metrics": {"probe/loss": loss},
             "source": {"model": name, "model_type": type(model).__name__,
                        "seq_len": probe["seq_len"], "probe_size": probe["batch_size"],
                        **(source or {})}}
    return captured_report(name, entry, f"{name} (own model)", zoo_blocks=zoo_blocks)
