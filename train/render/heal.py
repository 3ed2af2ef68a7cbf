"""`rankzoo compress --heal`'s curve drawn: the table (rich and Markdown), the saved cache's
bytes, and the figure.

    out.print(heal_table(doc));  text = heal_markdown(doc)   # doc["heal"]: heal.py's
    write_heal_plot(doc, "plots")                            # plots/heal.png
    saved_cache_text(doc)          # "its low-rank cache held 65536 B for 512 tokens ..."

The table is one TableSpec (train/render/table.py): a row per evaluation, the tokens
healed on, the eval loss and its change against the full cache, the share of the
training-free loss change recovered, and the healing objective on the batches since the
row before. The figure is the loss change against the healing tokens.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .table import TableSpec, columns, fmt, to_markdown, to_rich

COLUMNS = ("tokens", "steps", "eval loss", "Δ loss", "recovered", "train objective")


def recovered(delta: float, start: float) -> float | None:
    """The share of the training-free loss change healed away (1: all of it)."""
    return None if start <= 0 else 1.0 - delta / start


def heal_spec(doc: dict) -> TableSpec:
    h = doc["heal"]
    start = h["curve"][0]["delta_loss"]
    rows = [[f"{p['tokens']:,}", str(p["step"]), fmt(p["loss"], ".4f"),
             fmt(p["delta_loss"], "+.4f"), fmt(recovered(p["delta_loss"], start), ".0%"),
             fmt(p["train_loss"], ".4f")] for p in h["curve"]]
    a = h["adapters"]
    title = (f"heal {h['setting']} ({h['ratio']:.2f}x): {h['objective']} on "
             f"{h['tokens']:,} tokens ({h['steps']} steps of {h['batch_size']} x "
             f"{h['seq_len']}), LoRA r={a['rank']} on {a['projections']} attention "
             f"projections ({a['params']:,} parameters), the cache's projections in place")
    legend = (f"Δ loss against the full cache's eval loss {h['full_loss']:.4f}; recovered: "
              f"the share of the training-free Δ loss healed away; train objective: the "
              f"mean {h['objective']} loss on the batches since the row above; tolerance "
              f"{h['tolerance']:g}")
    return TableSpec(columns=columns(*COLUMNS, numeric=COLUMNS), rows=rows, title=title,
                     legend=legend)


def heal_table(doc: dict) -> Table:
    return to_rich(heal_spec(doc), pad_edge=True, padding=(0, 1))


def heal_markdown(doc: dict) -> str:
    return to_markdown(heal_spec(doc), level=2)


def saved_cache_text(doc: dict) -> str | None:
    """How the saved model's low-rank cache held up, in words; None when not decoded."""
    c = (doc.get("saved") or {}).get("cache")
    if not c:
        return None
    same = "as" if c["held_bytes"] == c["reported_bytes"] else "NOT as"
    return (f"its low-rank cache held {c['held_bytes']:,} B of {c['cache_dtype']} codes for "
            f"{c['tokens']} tokens ({c['held_bytes_per_token']:.1f} B/token), {same} the row "
            f"counts ({c['reported_bytes_per_token']:.1f} B/token); logits within "
            f"{c['max_logit_error']:.2g} of the measured model's (largest {c['logit_scale']:.3g}"
            f"; next-token loss {c['delta_loss']:+.2g} nats)")


def heal_figure(doc: dict):
    """Δ eval loss against the healing tokens, the tolerance and 0 drawn."""
    from matplotlib.figure import Figure

    h = doc["heal"]
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    tokens, deltas = zip(*((p["tokens"], p["delta_loss"]) for p in h["curve"]), strict=True)
    ax.plot(tokens, deltas, marker="o", label=f"{h['setting']} ({h['objective']})")
    ax.axhline(h["tolerance"], color="grey", linestyle=":", linewidth=1,
               label=f"tolerance {h['tolerance']:g}")
    ax.axhline(0.0, color="black", linewidth=0.6)
    # symlog: the training-free point at 0 beside the doubling steps, each one step apart
    ax.set_xscale("symlog", linthresh=max(min(t for t in tokens if t) if any(tokens) else 1, 1))
    ax.set_xlim(left=0)
    top = max(*deltas, h["tolerance"] if h["tolerance"] < 2 * max(deltas) else 0.0)
    bottom = min(0.0, *deltas)
    margin = 0.08 * ((top - bottom) or 0.05)
    ax.set_ylim(bottom - margin, top + margin)
    ax.set_xlabel("healing tokens")
    ax.set_ylabel("Δ eval loss (nats per token)")
    name = doc["source"].get("variant") or Path(doc["source"].get("hf", "")).name
    ax.set_title(f"{name}: healing {h['ratio']:.2f}x", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def write_heal_plot(doc: dict, out_dir) -> Path:
    """heal.png in out_dir."""
    from .plots import save_figure

    return save_figure(heal_figure(doc), Path(out_dir) / "heal.png")
