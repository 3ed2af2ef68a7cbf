"""train/render/ on reports built by hand in the report's JSON (and without its newer keys,
as older report.json files are): status first, the budget by part, labelled totals, heads,
the residual stream, advice with its conditions, the HF sections, 80 columns."""

from __future__ import annotations

import copy

import pytest
from rich.console import Console

from train.render import (
    PARTS,
    advice_markdown,
    budget_totals,
    hf_markdown,
    hf_report_markdown,
    part_of,
    render_advice,
    render_hf_table,
    render_table,
    to_markdown,
)

CLASSES = ("dead", "sink", "local", "rank-1", "broad")
NEW_VARIANT_KEYS = ("status", "budget", "adapter_note")
NEW_LAYER_KEYS = ("heads", "residual", "input_centered_erank", "centered_na")
NEW_ROW_KEYS = ("part", "realized_max_sample")
HEAD_RULES = ("dead: centered energy < 0.001 of raw; sink: first-token mass > 0.5; local: "
              "diagonal mass > 0.5; rank-1: raw erank < 1.5; else broad")


def axis_row(axis, quantity, declared, per_head, part, max_sample=None) -> dict:
    mean = sum(per_head) / len(per_head)
    return {"axis": axis, "quantity": quantity, "declared": declared, "realized_mean": mean,
            "realized_max": max(per_head), "utilization": mean / declared if declared else None,
            "per_head": per_head, "verdict": "healthy", "part": part,
            "realized_max_sample": max(per_head) + 1 if max_sample is None else max_sample}


def head_findings(i: int, n_heads: int) -> dict:
    """Layer i's heads: head h gets class CLASSES[(i + h) % 5], the figures to match."""
    classes = [CLASSES[(i + h) % len(CLASSES)] for h in range(n_heads)]
    ok = [c != "dead" for c in classes]
    return {"class": classes,
            "first_token_mass": [0.9 if c == "sink" else 0.1 for c in classes],
            "diagonal_mass": [0.8 if c == "local" else 0.2 for c in classes],
            "raw_erank": [1.1 if c == "rank-1" else 3.0 + h for h, c in enumerate(classes)],
            "past_future_max": [float(2 + h) for h in range(n_heads)],
            "centered_ok": ok,
            "summary": f"{classes.count('sink')} of {n_heads} heads are sinks"}


def make_layer(i: int, n_heads: int, T: int) -> dict:
    pf = [float(1 + (h + i) % 3) for h in range(n_heads)]
    heads = head_findings(i, n_heads)
    dead = heads["class"].count("dead")
    return {
        "layer": i, "name": f"layers.{i}.mix", "block": "softmax",
        "axes": [axis_row("mixing", "past_future", T // 2, pf, "pretrain"),
                 axis_row("logits", "qk", 8, [3.0] * n_heads, "pretrain"),
                 axis_row("value_path", "value", 8, [7.5] * n_heads, "pretrain"),
                 axis_row("out", "out", 8, [6.0] * n_heads, "pretrain"),
                 axis_row("inference", "inference.k", 64, [12.0] * n_heads, "inference"),
                 axis_row("inference", "inference.v", 64, [9.0] * n_heads, "inference")],
        "mixing_centered_erank": 3.5 if dead < n_heads else None,
        "hidden_centered_erank": 21.4, "input_centered_erank": 21.4, "collapsed": False,
        "heads": heads,
        **({"centered_na": f"{dead} of {n_heads} heads: centered energy < 1e-3 of raw"}
           if dead else {}),
        "residual": {"centered_erank": 6.9 + i, "norm_median": 130.0,
                     "massive": [{"sample": b, "position": 0, "norm": 130.0 * (177 + b),
                                  "ratio": 177.0 + b} for b in range(2)]},
    }


def per_layer_budget(layer: dict) -> dict:
    caps = {a["axis"]: a["declared"] for a in layer["axes"]}
    row = {"pretrain": caps["mixing"] + caps["logits"] + caps["value_path"], "adapter": 0,
           "inference": caps["inference"]}
    return {"layer": layer["layer"], **row, "total": sum(row.values())}


STATUSES = (
    {"state": "finished", "step": 600, "max_steps": 600, "learned": True,
     "reason": "val/accuracy 0.93 above chance", "baseline": {
         "task": "mqar", "chance_accuracy": 0.0156, "entropy_floor": None,
         "unigram_loss": None}},
    {"state": "stopped", "step": 300, "max_steps": 600, "learned": None,
     "reason": "killed at step 300", "baseline": {
         "task": "mqar", "chance_accuracy": 0.0156, "entropy_floor": None,
         "unigram_loss": None}},
    {"state": "diverged", "step": 412, "max_steps": 600, "learned": None,
     "reason": "loss became NaN", "baseline": None},
    {"state": "finished", "step": 600, "max_steps": 600, "learned": False,
     "reason": "val/loss 2.31 is not below the unigram loss", "baseline": {
         "task": "markov", "chance_accuracy": None, "entropy_floor": 1.234,
         "unigram_loss": 2.305}},
)


def make_variant(name: str, n_layers: int, n_heads: int, status: dict, T: int = 64) -> dict:
    layers = [make_layer(i, n_heads, T) for i in range(n_layers)]
    per_layer = [per_layer_budget(ly) for ly in layers]
    model = {k: sum(r[k] for r in per_layer) for k in ("pretrain", "adapter", "inference",
                                                        "total")}
    return {"variant": name, "step": status["step"], "params": 12345,
            "metrics": {"val/accuracy": 0.5}, "seq_len": T, "eps": 0.1,
            "budget_total": model["total"], "layers": layers,
            "final_hidden_centered_erank": 4.0, "status": copy.deepcopy(status),
            "budget": {"per_layer": per_layer, "model": model}}


def make_report(n_variants: int = 4, n_layers: int = 2, n_heads: int = 5) -> dict:
    """A report with run statuses and head classes: variant i gets STATUSES[i % 4], every
    class of head occurs, layer 0 has a dead head (centered n/a), every layer a massive
    token at pos 0."""
    variants = [make_variant(f"v{i}", n_layers, n_heads, STATUSES[i % len(STATUSES)])
                for i in range(n_variants)]
    advice = [
        {"kind": "cheaper_block", "variant": "v0", "layer": 1, "realized": 3, "declared": 32,
         "state": 3, "text": "v0 layer 1: past->future rank stays <= 3 at T 16, 32, 64",
         "conditions": {"eps": 0.1, "batch_size": 4, "seq_len": 64, "checked": True,
                        "max_observed": 3}},
        *({"kind": "no_advice", "variant": v["variant"], "text": v["status"]["reason"]}
          for v in variants[1:]),
    ]
    return {"schema": "rankzoo.report", "version": 1, "experiment": "hand",
            "variants": variants, "advice": advice, "head_rules": HEAD_RULES,
            "thresholds": {"saturated": 0.9, "over_provisioned": 0.25, "collapsed_erank": 2.0,
                           "cheaper_block_util": 0.5, "min_compression": 1.25}}


def old_format(report: dict) -> dict:
    """The same report as an older report.json: no status or head-class keys, no W_O row."""
    old = copy.deepcopy(report)
    old.pop("head_rules", None)
    for item in old["advice"]:
        item.pop("conditions", None)
    old["advice"] = [a for a in old["advice"] if a["kind"] != "no_advice"]
    for v in old["variants"]:
        for k in NEW_VARIANT_KEYS:
            v.pop(k, None)
        for layer in v["layers"]:
            for k in NEW_LAYER_KEYS:
                layer.pop(k, None)
            layer["axes"] = [a for a in layer["axes"] if a["axis"] != "out"]
            for a in layer["axes"]:
                for k in NEW_ROW_KEYS:
                    a.pop(k, None)
    return old


def text_of(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def md_section(md: str, heading: str) -> str:
    """The text of one '## heading' section of a Markdown document."""
    start = md.index(f"## {heading}")
    end = md.find("\n## ", start + 1)
    return md[start:] if end < 0 else md[start:end]


@pytest.fixture
def report():
    return make_report()


# ---------------------------------------------------------------- status

def test_status_comes_first_and_says_how_each_run_ended(report):
    text = text_of(render_table(report))
    status = text[:text.index("pretrain:")]  # before the first budget table
    v0, v1, v2, v3 = report["variants"]
    assert f"finished at step {v0['status']['step']} of {v0['status']['max_steps']}" in status
    assert f"stopped at step {v1['status']['step']} of {v1['status']['max_steps']}" in status
    assert f"diverged at step {v2['status']['step']}" in status
    assert f"did not learn: {v3['status']['reason']}" in " ".join(status.split())
    markov = v3["status"]["baseline"]
    assert (f"entropy floor {markov['entropy_floor']:.3g}, unigram loss "
            f"{markov['unigram_loss']:.3g}") in " ".join(status.split())
    assert f"chance accuracy {v0['status']['baseline']['chance_accuracy']:.3g}" in status
    md = to_markdown(report)
    assert md.index("## Status") < md.index("## Pretrain")
    assert f"- **v3**: finished at step 600 of 600; did not learn: {v3['status']['reason']}" in md


def test_status_line_of_an_old_report_says_it_is_not_recorded(report):
    md = to_markdown(old_format(report))
    assert md_section(md, "Status").count("run status not recorded") == len(report["variants"])


# ---------------------------------------------------------------- parts and totals

def test_markdown_tables_by_part_with_w_o_in_pretrain(report):
    md = to_markdown(report)
    n_layers = len(report["variants"][0]["layers"])
    for part in PARTS:
        section = md_section(md, part.capitalize())
        rows = [ln for ln in section.splitlines() if ln.startswith("| v") and " variant " not in ln]
        expected = [a["axis"] for v in report["variants"] for ly in v["layers"]
                    for a in ly["axes"] if a["part"] == part]
        assert [ln.split("|")[4].strip() for ln in rows] == expected, part
    pretrain = md_section(md, "Pretrain")
    assert sum("| out | out |" in ln for ln in pretrain.splitlines()) == 4 * n_layers
    assert "| past_future |" in pretrain and "inference.k" not in pretrain
    assert "inference.k" in md_section(md, "Inference")


def test_adapter_part_says_none_attached_or_the_variants_note(report):
    md = to_markdown(report)
    assert "- none attached (every variant)" in md_section(md, "Adapter")
    note = "none attached; a LoRA of r = 8 on wq, wv would add 16 per layer"
    report["variants"][0]["adapter_note"] = note
    adapter = md_section(to_markdown(report), "Adapter")
    others = ", ".join(v["variant"] for v in report["variants"][1:])
    assert f"- {note} (v0)" in adapter and f"- none attached ({others})" in adapter
    assert f"adapter: {note} (v0)" in " ".join(text_of(render_table(report)).split())


def test_totals_are_labelled_per_layer_and_per_model(report):
    md = md_section(to_markdown(report), "Declared caps")
    v = report["variants"][0]
    model = v["budget"]["model"]
    model_row = next(ln for ln in md.splitlines() if ln.startswith("| **v0**"))
    cells = [c.strip().strip("*") for c in model_row.strip("|").split("|")]
    assert cells[1] == "model total, sum over layers"
    assert cells[2:] == [str(model[k]) for k in ("pretrain", "adapter", "inference", "total")]
    n = len(v["layers"])  # identical layers read as one run of layers, per layer
    per = v["budget"]["per_layer"][0]
    assert (f"| v0 | each of 0-{n - 1} | {per['pretrain']} | 0 | {per['inference']} | "
            f"{per['total']} |") in md


def test_old_report_totals_come_from_the_rows_and_budget_total(report):
    old = old_format(report)
    for new, v in zip(report["variants"], old["variants"], strict=True):
        per_layer, model = budget_totals(v)
        assert per_layer == new["budget"]["per_layer"]  # the caps the rows carry
        assert model == new["budget"]["model"]
        assert model["total"] == v["budget_total"]
    # a cap the rows cannot show: the model total is still the report's budget_total
    old["variants"][0]["budget_total"] += 7
    assert budget_totals(old["variants"][0])[1]["total"] == report["variants"][0][
        "budget_total"] + 7


# ---------------------------------------------------------------- heads and residual

def test_head_summary_counts_and_rules(report):
    md = to_markdown(report)
    heads = md_section(md, "Heads")
    assert HEAD_RULES in heads
    for v in report["variants"]:
        for layer in v["layers"]:
            h = layer["heads"]
            counts = [str(h["class"].count(c)) for c in CLASSES]
            assert f"| {v['variant']} | {layer['layer']} | {' | '.join(counts)} | " \
                   f"{h['summary']}" in heads
    text = " ".join(text_of(render_table(report)).split())
    assert HEAD_RULES in text and report["variants"][0]["layers"][0]["heads"]["summary"] in text


def test_centered_metrics_read_n_a_when_no_head_has_centered_energy(report):
    layer = report["variants"][0]["layers"][0]
    n = len(layer["heads"]["class"])
    layer["heads"]["class"] = ["dead"] * n
    layer["heads"]["centered_ok"] = [False] * n
    layer["mixing_centered_erank"] = None
    layer["centered_na"] = f"{n} of {n} heads: centered energy < 1e-3 of raw"
    row = next(ln for ln in md_section(to_markdown(report), "Pretrain").splitlines()
               if ln.startswith("| v0 | 0 |"))
    assert row.split("|")[-3].strip() == f"n/a/{layer['input_centered_erank']:.1f}"
    assert f"centered n/a: {layer['centered_na']}" in md_section(to_markdown(report), "Heads")
    # some heads ok: the mean over those, starred
    partial = report["variants"][0]["layers"][1]
    assert not all(partial["heads"]["centered_ok"])
    row = next(ln for ln in md_section(to_markdown(report), "Pretrain").splitlines()
               if ln.startswith("| v0 | 1 |"))
    assert row.split("|")[-3].strip().startswith(f"{partial['mixing_centered_erank']:.1f}*")


def test_residual_beside_the_normed_input_with_massive_tokens(report):
    section = md_section(to_markdown(report), "Residual stream")
    for v in report["variants"]:
        for layer in v["layers"]:
            res = layer["residual"]
            top = max(m["ratio"] for m in res["massive"])
            assert (f"| {v['variant']} | {layer['layer']} | {res['centered_erank']:.1f} | "
                    f"{layer['input_centered_erank']:.1f} |") in section
            pos = res["massive"][0]["position"]
            assert f"pos {pos}: {top:.0f}x median ({len(res['massive'])} samples)" in section
    assert "exceeds the probe's stated multiple of the layer's median" in section
    for v in report["variants"]:
        for layer in v["layers"]:
            layer["residual"]["massive_ratio"] = 20.0
    assert "exceeds 20x the layer's median" in to_markdown(report)


# ---------------------------------------------------------------- advice

def test_advice_states_its_conditions_and_no_advice_items(report):
    md = advice_markdown(report)
    bound = report["advice"][0]
    c = bound["conditions"]
    assert (f"- {bound['text']} [eps {c['eps']:g}, probe {c['batch_size']} x T {c['seq_len']}, "
            f"checked on every sample and head: max observed {c['max_observed']}]") in md
    for item in report["advice"][1:]:
        assert f"- no advice for {item['variant']}: {item['text']}" in md
    stated = f"{report['advice'][1]['variant']}: no architecture advice: the run stopped"
    report["advice"][1]["text"] = stated  # a text that says so itself is shown as is
    assert f"- {stated}\n" in advice_markdown(report)
    table = render_advice(report)
    assert table.row_count == len(report["advice"])
    assert "probe 4 x T 64" in " ".join(text_of(table).split())
    c["checked"] = False
    assert "NOT checked" in advice_markdown(report)


# ---------------------------------------------------------------- widths and old files

@pytest.mark.parametrize("fmt", ["new", "old"])
def test_terminal_report_fits_80_columns_uncut(report, fmt):
    if fmt == "old":
        report = old_format(report)
    report["variants"][0]["variant"] = "a-rather-long-variant-name"
    text = text_of(render_table(report))
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "…" not in text
    for v in report["variants"]:  # every number of every row, uncut
        for layer in v["layers"]:
            for a in layer["axes"]:
                assert f"{a['realized_max']:.1f}" in text
    assert ("residual stream" in text) == (fmt == "new")
    assert ("heads per layer" in text) == (fmt == "new")


def test_old_report_renders_without_the_new_sections(report):
    old = old_format(report)
    md = to_markdown(old)
    assert "## Heads" not in md and "## Residual" not in md
    assert "none attached" in md_section(md, "Adapter")
    details = md.split("## Status", 1)[1]  # past the short answer's one row per variant
    rows = [ln for ln in details.splitlines() if ln.startswith("| v0 |")]
    n_rows = sum(len(ly["axes"]) for ly in old["variants"][0]["layers"])
    assert len(rows) == n_rows + 1  # axis rows, then the totals of the (identical) layers
    assert "| **v0** | **model total, sum over layers** |" in md
    assert all(ln.split("|")[9].strip() == "-" for ln in rows[:n_rows])  # no max sample


def test_unknown_axis_is_named():
    with pytest.raises(ValueError, match="'weird': unknown axis 'sideways'"):
        part_of({"axis": "sideways", "quantity": "weird"})


# ---------------------------------------------------------------- Hugging Face

def hf_report(report: dict) -> dict:
    """The first variant as build_hf_report writes it: source, per-head eranks, no status."""
    hf = copy.deepcopy(report)
    hf["variants"] = hf["variants"][:1]
    v = hf["variants"][0]
    del v["status"]
    v["metrics"] = {"probe/loss": 2.4567}
    for layer in v["layers"]:
        n = len(layer["heads"]["class"])
        layer["erank"] = {"mixing": [2.0] * n, "mixing_centered": [3.0] * n,
                          "past_future": [1.5] * n, "hidden_centered": [20.0]}
    hf["source"] = {"hf": "/models/tiny", "model_type": "llama", "text": "book.txt",
                    "tokens": "tokenizer", "probe_size": 4, "seq_len": 64, "device": "cpu",
                    "dtype": "float32"}
    return hf


def test_hf_markdown_shows_the_probe_and_head_classes_never_training_columns(report):
    hf = hf_report(report)
    src = hf["source"]
    md = hf_report_markdown(hf)
    assert f"next-token loss {hf['variants'][0]['metrics']['probe/loss']:.3f}" in md
    assert f"{src['probe_size']} x {src['seq_len']} tokens of {src['text']} ({src['tokens']})" \
        in md
    for column in ("val/accuracy", "train/loss", "params", "## Variants"):
        assert column not in md
    status = md_section(md, "Status")  # the probe stands where a run's status would
    assert "pretrained model, probed as loaded" in status and "next-token loss" in status
    section = hf_markdown(hf)
    for layer in hf["variants"][0]["layers"]:
        classes = layer["heads"]["class"]
        cell = ", ".join(f"{classes.count(c)} {c}" for c in CLASSES if classes.count(c))
        row = next(ln for ln in section.splitlines() if ln.startswith(f"| {layer['layer']} |"))
        assert row.rstrip(" |").endswith(cell)
    table = text_of(render_hf_table(hf), width=160)
    assert "2.457" in table and "book.txt" in table
    # the machine, in the terminal's details as in the Markdown: how the spectra ran
    hf["source"].update(eigensolver="2 workers x 1 thread (timed: 1 worker 0.044 s)", threads=1)
    line = ("device cpu, dtype float32, torch on 1 thread; eigensolver 2 workers x 1 thread "
            "(timed: 1 worker 0.044 s)")
    assert line in text_of(render_hf_table(hf), width=160)
    assert f"- {line}" in hf_markdown(hf)


def test_hf_markdown_of_an_old_hf_report(report):
    hf = old_format(hf_report(report))
    md = hf_markdown(hf)  # renders; the class cell reads "-"
    assert all(ln.rstrip().endswith("| - |") for ln in md.splitlines()
               if ln.startswith("| 0 |") or ln.startswith("| 1 |"))


def test_adapter_rows_are_their_own_part_and_count_in_the_totals(report):
    layer = report["variants"][0]["layers"][0]
    layer["axes"] += [axis_row("adapter", f"adapter.{m}.default", r, [2.0], "adapter")
                      for m, r in (("wq", 8), ("wv", 4))]
    report["variants"][0]["adapter_note"] = "attached: rank 12 per model"
    adapter = md_section(to_markdown(report), "Adapter")
    assert "| v0 | 0 | softmax | adapter | adapter.wq.default | 8 |" in adapter
    assert "| v0 | 0 | softmax | adapter | adapter.wv.default | 4 |" in adapter
    assert "- attached: rank 12 per model (v0)" in adapter
    text = text_of(render_table(report))
    assert "wq.default" in text and "wv.default" in text
    old = old_format(report)  # without variant["budget"]: each LoRA pair's r, summed
    per_layer, model = budget_totals(old["variants"][0])
    assert per_layer[0]["adapter"] == 8 + 4 and model["adapter"] == 8 + 4
