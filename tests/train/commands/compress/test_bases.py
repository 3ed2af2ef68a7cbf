"""`rankzoo compress` on zoo models: what output-aware bases buy against energy bases, and
the scale their gains are on (the squared error each layer's output takes per token)."""

from __future__ import annotations

import pytest
import torch

from tests.train.commands.compress.test_compress import FAMILIES, tiny, tokens
from train.commands.compress import CompressOptions
from train.commands.compress.bases.calibrate import calibrate
from train.commands.compress.bases.lowrank import full_ranks, projectors
from train.commands.compress.target.zoo_surgery import ZooTarget
from train.lm.decoder import DecoderLM


def distilled_delta(model: DecoderLM, bases: str, r: int, seed: int) -> float:
    """The loss change at rank r of every slot on held-out tokens, against the labels the
    full model predicts (a random model's own data: its loss there is what it knows)."""
    target = ZooTarget(model)
    calib, x = tokens(16, 24, seed=seed + 100), tokens(16, 24, seed=seed + 200)
    with torch.no_grad():
        y = model(x).argmax(-1)
    base = target.evaluate(x, y, 8)["loss"]
    cal = calibrate(target, calib, 8, bases)
    P = {s.key: projectors(cal.bases[s.key], [r] * s.heads, cal.encoders[s.key])
         for s in target.slots}
    with target.projected(P):
        return target.evaluate(x, y, 8)["loss"] - base


def sharp(seed: int, block: str = "softmax", kwargs: dict | None = None) -> DecoderLM:
    """A tiny random model with its matrices doubled: attention and predictions sharp
    enough for the projection to show in the loss."""
    model = tiny(block, seed=seed, **(kwargs or {"n_heads": 2}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.0)
    return model


@pytest.mark.parametrize("family", ["mha", "mla"])
def test_output_bases_lose_less_than_energy_bases_at_equal_rank(family):
    block, kwargs = FAMILIES[family]
    deltas = {(seed, r): {b: distilled_delta(sharp(seed, block, kwargs), b, r, seed)
                          for b in ("energy", "output")}
              for seed in range(3) for r in (2, 4)}
    wins = sum(d["output"] <= d["energy"] for d in deltas.values())
    assert wins > len(deltas) / 2, deltas
    clear = min(deltas.values(), key=lambda d: d["output"] / max(d["energy"], 1e-12))
    assert clear["output"] < 0.75 * clear["energy"], clear


def block_outputs(model: DecoderLM, x: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each zoo block's output on x [B, T], before its layer adds it to the stream."""
    outs: dict[int, torch.Tensor] = {}
    hooks = [b.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o.detach()))
             for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return outs


@pytest.mark.parametrize("family", ["mha", "gqa-norope", "window", "mla"])
def test_output_gains_predict_the_blocks_output_error_on_one_scale(family):
    # the gains a slot drops at rank r, times its layer's residual energy, are the squared
    # error the block's output takes per token (train/commands/compress/bases/readout.py, to
    # first order): keys, values and latents on one scale, which the greedy allocation compares
    block, kwargs = FAMILIES[family]
    model = sharp(0, block, kwargs)
    target = ZooTarget(model)
    calib = tokens(16, 24, seed=100)
    cal = calibrate(target, calib, 16, "output")
    assert cal.one_scale
    base = block_outputs(model, calib)
    for s in target.slots:
        for r in (1, 2):
            ranks = {**full_ranks(target.slots), s.key: [r] * s.heads}
            P = {k: projectors(cal.bases[k], ranks[k], cal.encoders[k]) for k in ranks}
            with target.projected(P):
                out = block_outputs(model, calib)[s.layer]
            measured = float((out - base[s.layer]).double().square().sum(-1).mean())
            predicted = float(cal.energy[s.key][:, r:].sum()) * cal.residual[s.layer]
            assert 0.5 < measured / predicted < 2.0, (s.key, r, measured, predicted)


@pytest.mark.parametrize("family, bases, scaled", [
    ("mha", "output", True), ("mla", "output", True), ("mha", "energy", False),
    ("linear", "output", False), ("moe", "output", False)])
def test_greedy_scaled_is_measured_only_where_the_gains_share_one_scale(family, bases, scaled):
    from train.commands.compress.allocation.settings import settings

    block, kwargs = FAMILIES[family]
    target = ZooTarget(tiny(block, **kwargs))
    cal = calibrate(target, tokens(), 4, bases)
    assert cal.one_scale is scaled
    notes: list[str] = []
    options = CompressOptions(ratios=(2.0,), allocations=("greedy", "greedy-scaled"))
    got = [alloc for alloc, *_ in settings(target, cal, None, options, 12, None, notes)]
    assert got == (["greedy", "greedy-scaled"] if scaled else ["greedy"])
    assert any("greedy-scaled: left out" in n for n in notes) is not scaled


@pytest.mark.parametrize("options, windowable", [
    ({}, True), ({"sinks": True}, False), ({"output_gate": "headwise"}, False),
    ({"chunk": 4}, False), ({"rope": False}, True)])
def test_a_head_is_read_through_a_window_only_where_the_windowed_forward_is_exact(options,
                                                                                 windowable):
    """The windowed forward (zoo_surgery.py) re-attends without sinks, gates or chunks."""
    import zoo
    from train.commands.compress.target.zoo_projections import PROJECTIONS

    block = zoo.build("softmax", d_model=16, n_heads=2, **options)
    assert PROJECTIONS["kv"].windowable(block) is windowable
