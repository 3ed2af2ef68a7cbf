"""The sections of a Hugging Face report: a pretrained model probed as loaded, so no
training columns; per layer the effective ranks of what its attention reads and mixes,
and the classes of its heads.

    out.print(render_hf_table(report)); Path("report.md").write_text(hf_markdown(report))
"""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.text import Text

from budgets.advice.rows import row_text

from .heads import HEAD_CLASSES, class_counts, head_legend
from .indexer import indexer_line, loss_check_text
from .kinds import kinds_spec
from .table import BOXED, Column, TableSpec, fmt, to_markdown, to_rich

HF_COLUMNS = ("layer", "hidden erank Hc", "mixing erank P", "erank Pc", "past->future erank",
              "head classes")


def is_hf(report: dict) -> bool:
    return "source" in report  # build_hf_report: a pretrained model, probed as loaded


def probe_source_text(report: dict) -> str:
    """'probe: 4 x 128 tokens of book.txt (tokenizer, BOS (id 1) first, as the tokenizer
    adds it); next-token loss 2.345'."""
    v, src = report["variants"][0], report["source"]
    loss = v["metrics"].get("probe/loss")
    bos = f", {src['bos']}" if "bos" in src else ""
    return (f"probe: {src['probe_size']} x {src['seq_len']} tokens of {src['text']} "
            f"({src['tokens']}{bos}); next-token loss {fmt(loss, '.3f')}")


def shared_line(report: dict) -> str | None:
    """'shared weights (one set, measured at each call): layers 1, 3
    (model.layers.1.shared_transf.self_attn)', or None."""
    seen: dict[str, list[int]] = {}
    for layer in report["variants"][0]["layers"]:
        shared = layer.get("shared")
        if shared:  # "mixers": a report from before layers were the model's own numbers
            seen.setdefault(shared["module"], shared.get("layers", shared.get("mixers")))
    if not seen:
        return None
    groups = "; ".join(f"layer{'s' * (len(ls) > 1)} {', '.join(map(str, ls))} ({m})"
                       for m, ls in seen.items())
    return f"shared weights (one set, measured at each call): {groups}"


def unmeasured_line(report: dict) -> str | None:
    """'not measured: lfm2 layers 0, 2 (Lfm2ShortConv) ...', or None when every decoder
    layer's mixer was read."""
    mixers = report.get("unmeasured_mixers")
    if not mixers:
        return None
    by_class: dict[str, list[str]] = {}
    for m in mixers:
        by_class.setdefault(m["class"], []).append(str(m["layer"]))
    named = "; ".join(f"layer{'s' if len(ls) > 1 else ''} {', '.join(ls)} ({c})"
                      for c, ls in by_class.items())
    return (f"not measured: {mixers[0]['model_type']} {named}: these decoder layers mix "
            f"tokens by nothing the probe reads (attention through transformers' interface, "
            f"a Mamba scan, a delta rule, a short convolution, RG-LRU or lightning "
            f"attention), so no row of theirs is in this report")


def gguf_line(report: dict) -> str | None:
    """'weights: GGUF file m.gguf, stored as Q8_0 (14 tensors), F32 (5); dequantized for
    the probe', or None for a model that was not read from a GGUF file."""
    g = report["source"].get("gguf")
    if not g:
        return None
    types = ", ".join(f"{t} ({n} tensor{'s' if n > 1 else ''})"
                      for t, n in sorted(g["quantization"].items()))
    return f"weights: GGUF file {g['file']}, stored as {types}; dequantized for the probe"


def _head_mean(xs) -> float | None:
    """The mean over heads; None where the matrix-free mode measured no head (erank is
    given only where the top singular values hold the whole spectrum)."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _class_cell(layer: dict) -> str:
    """'7 sink, 2 broad' (the layer's head classes), '-' without head findings."""
    counts = class_counts(layer.get("heads") or {})
    return ", ".join(f"{counts[c]} {c}" for c in HEAD_CLASSES if counts.get(c)) or "-"


def _hf_rows(report: dict):
    for layer in report["variants"][0]["layers"]:
        e = layer["erank"]
        pc = _head_mean(e["mixing_centered"])
        yield (row_text(layer), fmt(layer["hidden_centered_erank"], ".2f"),
               fmt(_head_mean(e["mixing"]), ".2f"),
               "n/a" if layer.get("centered_na") and layer.get("mixing_centered_erank") is None
               else fmt(pc, ".2f"),
               fmt(_head_mean(e["past_future"]), ".2f"), _class_cell(layer))


def hf_spec(report: dict) -> TableSpec:
    """Per layer: erank of the centered hidden states, raw/centered mixing eranks, and the
    head classes (numbers under long headers: the headers wrap on a narrow terminal)."""
    v = report["variants"][0]
    return TableSpec(
        title=f"{v['variant']}: effective ranks per layer (means over heads)",
        heading="Effective ranks per layer (means over heads)",
        columns=(*(Column(c, numeric=True, wrap=True) for c in HF_COLUMNS[:-1]),
                 Column(HF_COLUMNS[-1])),
        rows=list(_hf_rows(report)),
        legend=f"{probe_source_text(report)}; Hc = hidden states the attention reads, "
               f"centered over tokens; Pc = centered attention; {head_legend(report)}",
        markdown_legend=head_legend(report))


def render_hf_table(report: dict) -> RenderableType:
    """The per-layer table, then the per-kind one where the report has kinds."""
    style = {**BOXED, "box": box.SIMPLE_HEAD, "caption_justify": "left", "overflow": "fold"}
    kinds, missing, gguf = kinds_spec(report), unmeasured_line(report), gguf_line(report)
    parts = [to_rich(hf_spec(report), **style)]
    parts += [to_rich(kinds, **style)] if kinds is not None else []
    parts += [Text(missing, style="yellow")] if missing else []
    parts += [Text(line) for line in (shared_line(report), gguf, indexer_line(report),
                                      machine_line(report)) if line]
    return parts[0] if len(parts) == 1 else Group(*parts)


def machine_line(report: dict) -> str:
    """'device cpu, dtype float32, torch on 2 threads; eigensolver 2 workers x 1 thread
    (...); loss 4.86 captured, 4.86 without the capture (tolerance 1e-04)', or '' for a
    report that does not say (the threads and the eigensolver: budgets/rank/eigen.py's
    choices; the loss check: budgets/probe/faithful.py's)."""
    src = report.get("source", {})
    check = loss_check_text(src)  # the capture's loss check (budgets/probe/faithful.py)
    if "device" not in src or "dtype" not in src:
        return check
    threads = src.get("threads")
    return (f"device {src['device']}, dtype {src['dtype']}"
            + (f", torch on {threads} thread{'s' * (threads != 1)}" if threads else "")
            + (f"; eigensolver {src['eigensolver']}" if "eigensolver" in src else "")
            + (f"; {check}" if check else ""))


def hf_markdown(report: dict) -> str:
    """The HF model's section: the probe (text, tokens, loss) and per-layer eranks with
    head classes; no training columns (nothing was trained)."""
    src = report["source"]
    model = f"{src.get('hf', report['variants'][0]['variant'])} ({src.get('model_type', '?')})"
    lines = ["## Probe", "", f"- model: {model}", f"- {probe_source_text(report)}",
             *([f"- {machine_line(report)}"] if machine_line(report) else []),
             *([f"- {unmeasured_line(report)}"] if unmeasured_line(report) else []),
             *([f"- {shared_line(report)}"] if shared_line(report) else []),
             *([f"- {gguf_line(report)}"] if gguf_line(report) else []),
             *([f"- {indexer_line(report)}"] if indexer_line(report) else []),
             "", to_markdown(hf_spec(report))]
    kinds = kinds_spec(report)
    if kinds is not None:
        lines += ["", to_markdown(kinds)]
    return "\n".join(lines)
