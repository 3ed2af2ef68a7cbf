"""train/render/plots.py: grids of at most MAX_COLUMNS panels, one colour per variant, one legend,
heads heatmaps from the report, and every figure bounded in pixels at 32 layers x 16 heads."""

from __future__ import annotations

import math

import pytest
from matplotlib.colors import to_rgba
from PIL import Image

from tests.train.render.test_render import make_report, old_format
from train.render.plots import (
    DPI,
    HEAD_CLASSES,
    MAX_COLUMNS,
    MAX_PIXELS,
    budget_figure,
    head_panels,
    heads_figure,
    history_figure,
    save_figure,
    spectrum_figure,
    write_plots,
)

QUANTITIES = ("mixing_centered", "past_future", "qk", "value")
BUDGET = {"block": "softmax", "seq_len": 64, "n_heads": 16, "mixing": 32, "logits": 8,
          "value_path": 8, "inference": 64}


def probe_layer(i: int, n_heads: int, step: int, spectra: bool) -> dict:
    """A ranks.jsonl layer: per-head eranks and rank_eps that move with the step."""
    layer = {"layer": i, "block": "softmax", "budget": {**BUDGET, "n_heads": n_heads},
             "quantities": {"mixing_centered": {"erank": [1.0 + i + step / 100] * n_heads,
                                                "rank_eps": [2.0] * n_heads},
                            "past_future": {"erank": [1.5] * n_heads,
                                            "rank_eps": [2.0 + i % 4] * n_heads}}}
    if spectra:  # [heads][k], decaying
        layer["spectra"] = {q: [[2.0 ** -k for k in range(8)]] * n_heads for q in QUANTITIES}
    return layer


def probe_record(step: int, n_layers: int, n_heads: int, spectra: bool = True) -> dict:
    return {"step": step, "seq_len": 64, "eps": 0.1,
            "layers": [probe_layer(i, n_heads, step, spectra) for i in range(n_layers)]}


def histories(n_variants: int, n_layers: int, n_heads: int = 2) -> dict[str, list[dict]]:
    return {f"v{j}": [probe_record(s, n_layers, n_heads) for s in (100, 200, 300)]
            for j in range(n_variants)}


def png_size(path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


def grid_shape(fig) -> tuple[int, int]:
    """(rows, columns) of a figure's visible panels, from their positions."""
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    spec = axes[0].get_subplotspec().get_gridspec()
    return spec.nrows, spec.ncols


# ---------------------------------------------------------------- pixel bounds

@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """The four figures of a 32-layer x 16-head model with 8 variants, saved as PNG."""
    out = tmp_path_factory.mktemp("big")
    report = make_report(n_variants=8, n_layers=32, n_heads=16)
    figures = {"spectrum": spectrum_figure("v0", probe_record(300, 32, 16)),
               "rank_over_training": history_figure(histories(8, 32, 16)),
               "heads": heads_figure(report["variants"][0]),
               "declared_vs_realized": budget_figure(report)}
    return {name: png_size(save_figure(fig, out / f"{name}.png"))
            for name, fig in figures.items()}


@pytest.mark.parametrize("name", ["spectrum", "rank_over_training", "heads",
                                  "declared_vs_realized"])
def test_every_figure_is_bounded_at_32_layers_16_heads(big, name):
    width, height = big[name]
    assert width <= MAX_PIXELS[0] and height <= MAX_PIXELS[1], big


def test_grid_panels_stay_readable_at_32_layers(big):
    # 32 panels in 8 columns: each column at least 250 px wide, each row 200 px tall
    for name in ("spectrum", "rank_over_training"):
        width, height = big[name]
        assert width / MAX_COLUMNS >= 250 and height / math.ceil(32 / MAX_COLUMNS) >= 200, name


def test_bounds_hold_far_beyond_32_layers():
    # the size is fixed when the figure is made (save_figure keeps it): no need to draw
    # (96 layers: 12 rows of 2.3 inches would pass the height bound; history_figure uses
    # the same grid as the spectra)
    report = make_report(n_variants=1, n_layers=96, n_heads=64)
    for name, fig in {"spectrum": spectrum_figure("v", probe_record(1, 96, 2)),
                      "heads": heads_figure(report["variants"][0])}.items():
        width, height = fig.get_size_inches() * DPI
        assert width <= MAX_PIXELS[0] and height <= MAX_PIXELS[1], (name, width, height)


# ---------------------------------------------------------------- layouts

@pytest.mark.parametrize("n_layers, shape", [(2, (1, 2)), (8, (1, 8)), (9, (2, 8)),
                                             (32, (4, 8))])
def test_spectrum_grid_has_at_most_eight_columns(n_layers, shape):
    fig = spectrum_figure("v", probe_record(5, n_layers, 2))
    assert grid_shape(fig) == shape
    drawn = [ax for ax in fig.axes if ax.get_visible()]
    assert len(drawn) == n_layers and all(len(ax.lines) == len(QUANTITIES) for ax in drawn)
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)


def test_spectrum_without_spectra_is_none():
    assert spectrum_figure("v", probe_record(5, 3, 2, spectra=False)) is None


def test_rank_over_training_small_multiples_variant_as_colour():
    hist = histories(n_variants=3, n_layers=10)
    fig = history_figure(hist)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 10 and grid_shape(fig) == (2, 8)
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in panels)
    legend = {t.get_text(): h for t, h in zip(fig.legends[0].get_texts(),
                                              fig.legends[0].legend_handles, strict=True)}
    colour = {v: to_rgba(legend[v].get_color()) for v in hist}
    assert len(set(colour.values())) == len(hist)  # one colour per variant
    for ax in panels:  # two series (solid, dashed) per variant in every layer's panel
        lines = [(to_rgba(ln.get_color()), ln.get_linestyle()) for ln in ax.lines]
        assert sorted(lines) == sorted((c, s) for c in colour.values() for s in ("-", "--"))
    first = panels[0].lines[0]  # layer 0, variant v0, centered erank, from every record
    assert list(first.get_xdata()) == [r["step"] for r in hist["v0"]]


# ---------------------------------------------------------------- heads

def test_heads_heatmaps_layer_by_head_per_axis():
    report = make_report(n_variants=1, n_layers=6, n_heads=5)
    v = report["variants"][0]
    panels = {title: values for title, values, _ in head_panels(v)}
    assert list(panels) == ["first-token mass", "raw mixing erank",
                            "past->future rank (max over samples)", "head class"]
    assert panels["first-token mass"] == [ly["heads"]["first_token_mass"] for ly in v["layers"]]
    assert panels["head class"] == [[HEAD_CLASSES.index(c) for c in ly["heads"]["class"]]
                                    for ly in v["layers"]]
    fig = heads_figure(v)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 4 and all(im.get_array().shape == (6, 5) for im in images)
    classes = images[-1]
    # categorical: each class index falls in its own colour bin
    assert [classes.norm(i) for i in range(len(HEAD_CLASSES))] == list(range(len(HEAD_CLASSES)))


def test_heads_from_per_head_rows_when_the_report_has_no_heads():
    old = old_format(make_report(n_variants=1, n_layers=3, n_heads=4))
    v = old["variants"][0]
    panels = head_panels(v)
    assert [p[0] for p in panels] == ["past->future rank_eps (mean over samples)"]
    assert panels[0][1] == [next(a["per_head"] for a in ly["axes"]
                                 if a["quantity"] == "past_future") for ly in v["layers"]]
    for ly in v["layers"]:
        ly["axes"] = [a for a in ly["axes"] if a["quantity"] != "past_future"]
    assert heads_figure(v) is None


def test_layers_with_fewer_heads_are_padded():
    v = make_report(n_variants=1, n_layers=2, n_heads=4)["variants"][0]
    v["layers"][1]["heads"]["first_token_mass"] = [0.5, 0.5]
    values = dict((t, x) for t, x, _ in head_panels(v))["first-token mass"]
    assert len(values[1]) == 4 and all(math.isnan(x) for x in values[1][2:])


# ---------------------------------------------------------------- write_plots

def test_write_plots_adds_heads_figures_and_never_overwrites(tmp_path):
    run = tmp_path / "runs" / "hand"  # named in the notes only: the records come in
    hist = histories(n_variants=2, n_layers=3)
    report = make_report(n_variants=2, n_layers=3, n_heads=4)
    out = tmp_path / "figs"
    written, notes = write_plots(hist, report, out, run)
    assert sorted(p.name for p in written) == sorted(
        ["spectrum_v0.png", "spectrum_v1.png", "rank_over_training.png", "heads_v0.png",
         "heads_v1.png", "declared_vs_realized.png"]) == sorted(p.name for p in out.iterdir())
    assert notes == []
    before = {p: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(FileExistsError, match="not empty"):
        write_plots(hist, report, out, run)
    assert {p: p.read_bytes() for p in out.iterdir()} == before
