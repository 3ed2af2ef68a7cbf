"""The probe of captured mixer calls, whatever the model: one forward, each wanted layer
measured inside its call.

    p = CallProbe(model, maps, eps, builders, block="llama", asked=[0, 5])
    final, logits = probe_calls(p, run, sources, head)
    p.layers                                    # layer index -> its entry

The caller brings what is its own: `maps`, one per mixer call in the order the forward
makes them (each with `.module` and `.name`: an HF attention layer's projections, an SSD
mixer); `run`, its forward, returning logits; `sources`, each `(model, on_call) -> context
manager` feeding captured calls (budgets/capture/mixer.py's Mixer) to on_call; `head`, the
module whose input is the final hidden state; and `builders`, per call kind
(`call.kind_name`) the function that turns the call's mixing figures into a layer entry
(what each kind adds: projections, caches). Nothing here names a call type or a model
library: transformers' attention interface and the Mamba scans are two sources among any.

Each call is measured exactly from its mixing matrix (`call.exact()`) or, matrix-free,
from its operator (`call.operator()`), then released: the capture keeps every call, and
at 1 x 8192 their tensors held 1.7 GiB.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ..rank.matfree import K_MAX
from .blocks import (
    ProbeProgress,
    add_adapters,
    mixing_figures,
    mixing_figures_matfree,
    residual_owner,
    stream_figures,
)
from .inputs import module_inputs
from .places import Place, layer_count, mixer_places
from .signed import signed_mark
from .streams import MASSIVE_RATIO

# (probe, i, map, quantities, x, call, streams, moe) -> the layer's entry
EntryBuilder = Callable[..., dict]
Source = Callable[[nn.Module, Callable], contextlib.AbstractContextManager]


def check_layers(layers, n_layers: int, model_type: str) -> list[int]:
    """The layer indices to measure, sorted (None: all), each checked against the model."""
    if layers is None:
        return list(range(n_layers))
    if not layers:
        raise ValueError("layers=[]: no layer to measure")
    for i in layers:
        if not 0 <= i < n_layers:
            raise ValueError(f"layers={i}: out of range; the {model_type} model has "
                             f"{n_layers} layers (0-{n_layers - 1})")
    return sorted(set(layers))


def experts(module: nn.Module) -> bool:
    """Whether a decoder layer routes its tokens to experts (a mixture of experts)."""
    return any("expert" in name.rsplit(".", 1)[-1] for name, _ in module.named_modules())


def weight_groups(maps: list) -> dict[int, list[int]]:
    """Mixer index -> every mixer index with the same weights, for mixers whose weights
    serve several: one module called more than once (zamba's Mamba heads, a block reused
    by several layers) or modules whose parameters are tied (zamba's shared attention)."""
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(maps):
        first = next(m.module.parameters(), None)
        key = first.data_ptr() if first is not None else id(m.module)
        groups.setdefault(key, []).append(i)
    return {i: g for g in groups.values() if len(g) > 1 for i in g}


@dataclass
class CallProbe:
    """One probe's settings, its mixers and the layer entries measured so far."""

    model: nn.Module
    maps: list  # one per mixer call, in call order: .module, .name
    eps: float
    builders: Mapping[str, EntryBuilder]
    block: str  # the entries' block name (the model type)
    asked: list[int] | None = None  # layer indices to measure; None: all
    with_spectra: bool = False
    k_max: int = K_MAX
    progress: Callable[[ProbeProgress], None] | None = None
    massive_ratio: float = MASSIVE_RATIO
    # per mixer call, its decoder layer (the model's number) and name there; None: from
    # the maps' module paths (budgets/probe/places.py)
    places: list[Place] | None = None
    layers: dict[int, dict] = field(default_factory=dict)  # mixer index -> its entry

    def __post_init__(self) -> None:
        if self.places is None:
            self.places = mixer_places(self.model, self.maps)
        self.wanted = self._wanted()
        # module -> its mixer indices, one per call (several for a shared block)
        self.index: dict[nn.Module, list[int]] = {}
        for i, m in enumerate(self.maps):
            self.index.setdefault(m.module, []).append(i)
        self.calls: dict[nn.Module, int] = {}  # calls seen so far in the probe's forward
        self.sharing = weight_groups(self.maps)
        self.start = time.perf_counter()

    def _wanted(self) -> list[int]:
        """The mixer indices in the asked layers (the model's numbers), in call order."""
        numbers = {p.layer for p in self.places}
        asked = check_layers(self.asked, layer_count(self.model, self.places), self.block)
        wanted = [i for i, p in enumerate(self.places) if p.layer in asked]
        if not wanted:
            raise ValueError(f"layers={self.asked}: the probe reads no mixer in "
                             f"{'that layer' if len(asked) == 1 else 'those layers'} of the "
                             f"{self.block} model; it reads layers "
                             f"{', '.join(map(str, sorted(numbers)))}")
        return wanted

    def mixer_of(self, module: nn.Module) -> int | None:
        """The mixer index of this call of `module` (its k-th call: its k-th index)."""
        indices = self.index.get(module)
        if indices is None:
            return None
        k = self.calls.get(module, 0)
        self.calls[module] = k + 1
        return indices[k % len(indices)]

    def shared(self, i: int) -> dict | None:
        """{"module", "layers"} when mixer i's weights serve other mixers too (one module
        called several times, or tied weights), else None: the report says so, naming
        the layers (the model's numbers) whose mixers they are."""
        group = self.sharing.get(i)
        if group is None:
            return None
        return {"module": self.maps[group[0]].name,
                "layers": sorted({self.places[j].layer for j in group})}

    def record(self, i: int, figures: tuple[dict, dict], x: torch.Tensor, call,
               streams: dict[str, dict[int, torch.Tensor]]) -> None:
        """Layer i's entry from its mixing figures (mixing_figures), its input x [B, T, D],
        its call and what layer_streams caught of it (taken out of `streams`), built by
        the builder of the call's kind; then the progress callback."""
        layer_map = self.maps[i]
        quantities, extras = figures
        quantities["hidden_centered"], residual = stream_figures(
            x, streams["residual"].pop(i, None), self.eps, self.massive_ratio)
        if self.shared(i) is not None:
            extras["shared"] = self.shared(i)
        if residual is not None:
            extras["residual"] = residual
        owner = residual_owner(self.model, layer_map.name)
        moe = experts(self.model.get_submodule(owner) if owner else layer_map.module)
        layer = self.builders[call.kind_name](self, i, layer_map, quantities, x, call,
                                              streams, extras, moe)
        # LoRA pairs anywhere in the decoder layer (attention or MLP), if an adapter
        # was loaded; rows are named relative to the layer (self_attn.q_proj, ...)
        add_adapters(layer, self.model.get_submodule(layer_map.name.rpartition(".")[0]),
                     self.eps)
        if not self.with_spectra:
            del layer["spectra"]
        self.layers[i] = self._placed(i, layer)
        if self.progress is not None:
            self.progress(ProbeProgress(self.places[i].layer, len(self.layers),
                                        len(self.wanted), time.perf_counter() - self.start))

    def _placed(self, i: int, layer: dict) -> dict:
        """The entry under its decoder layer's own number and its path there, and, where
        the layer holds several mixers, which one it is ("mixer")."""
        place = self.places[i]
        head = {"layer": place.layer, **({"mixer": place.mixer} if place.mixer else {}),
                "name": place.name}
        return {**head, **{k: v for k, v in layer.items() if k not in head}}


@contextlib.contextmanager
def layer_streams(p: CallProbe):
    """Collect, by layer index for the wanted layers, {"residual": the decoder layer's
    input [B, T, D] (the residual stream; probes.residual_owner), "latent": the latent an
    MLA layer caches, its expanding linear's input (budgets/probe/cache_rows.py)}."""
    # a shared block's module path names only its first layer: its later calls get no
    # residual stream rather than that layer's
    owners = {i: residual_owner(p.model, p.maps[i].name) for i in p.wanted
              if p.index[p.maps[i].module][0] == i}
    layers = {i: p.model.get_submodule(o) for i, o in owners.items() if o is not None}
    latents = {i: p.maps[i].latent for i in p.wanted if getattr(p.maps[i], "latent", None)}
    with module_inputs(layers) as residual, module_inputs(latents) as latent:
        yield {"residual": residual, "latent": latent}


def _figures(p: CallProbe, call, matfree: bool) -> tuple[dict, dict]:
    signed = getattr(call, "signed", False)  # differential attention: M of either sign
    figures = mixing_figures_matfree(call.operator(), p.eps, p.k_max) if matfree else \
        mixing_figures(call.exact().float(), p.eps, signed=signed)
    if signed:  # what applies to signed mixing, and what was left out (signed.py)
        figures[1]["signed"] = signed_mark(figures[0])
    return figures


def _measuring(p: CallProbe, inputs: dict[int, torch.Tensor], streams: dict, matfree: bool):
    """The sources' callback: each wanted layer measured from its call, exactly from its
    mixing matrix or matrix-free from its operator; the call released once measured."""

    def on_call(call) -> None:
        i = p.mixer_of(call.module)
        if i is None:
            return
        x = inputs.pop(i)
        if i in p.wanted:
            p.record(i, _figures(p, call, matfree), x, call, streams)
        call.release()

    return on_call


def probe_calls(p: CallProbe, run: Callable[[], torch.Tensor], sources: list[Source],
                head: nn.Module | None, matfree: bool
                ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(final hidden states [B, T, D]: the input of `head`, None without one; the logits
    `run` returned), each wanted layer measured inside its call into p.layers. The hidden
    states each mixer reads (after its layer's pre-norm, as zoo probes it) are held until
    its call is measured; no per-layer hidden states or cache are kept."""
    mixers = {i: module for module, indices in p.index.items() for i in indices}
    heads = {"head": head} if head is not None else {}
    with (module_inputs(mixers) as inputs, layer_streams(p) as streams,
          module_inputs(heads) as final, contextlib.ExitStack() as stack):
        on_call = _measuring(p, inputs, streams, matfree)
        for source in sources:
            stack.enter_context(source(p.model, on_call))
        logits = run()
    return final.get("head"), logits
