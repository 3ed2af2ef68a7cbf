"""Energy against output-aware bases, side by side, on one model and one split of data.

    python -m benches.train.commands.compress.bench_bases --hf MODEL_DIR --text CALIB \
        --eval-text EVAL [--seq-len 512] [--calib-size 8] [--eval-size 8] [--ratios 1.14,1.33,2]
    python -m benches.train.commands.compress.bench_bases RUN_DIR/<variant> [--ratios ...]

Runs `rankzoo compress` twice, once per kind of basis, with the same calibration and
evaluation sequences, and prints per setting (the report's advised ranks, then uniform and
greedy per ratio) the ratio each reaches and the loss change each costs, in nats per
token, with the ratio energy / output of the loss changes. Both use the same cost model
(the bases shared and counted as weights).
"""

from __future__ import annotations

import argparse
import time

from train.commands.compress.options import CompressOptions
from train.commands.compress.run import compress_hf, compress_run

BASES = ("energy", "output")


def measure_both(args) -> dict[str, dict]:
    """{bases: compress document}, each with the same options but the bases."""
    docs = {}
    for bases in BASES:
        allocations = ("uniform", "greedy") + (("greedy-scaled",) if bases == "output" else ())
        options = CompressOptions(ratios=args.ratios, bases=bases, calib_size=args.calib_size,
                                  allocations=allocations,
                                  eval_size=args.eval_size, batch_size=args.batch_size)
        began = time.perf_counter()
        docs[bases] = (compress_hf(args.hf, args.text, args.eval_text, options,
                                   seq_len=args.seq_len, bos=not args.no_bos)
                       if args.hf else compress_run(args.run, options))
        docs[bases]["bench_seconds"] = time.perf_counter() - began
    return docs


def setting(row: dict) -> str:
    if row["allocation"] in ("full", "advised"):
        return row["allocation"]
    return f"{row['allocation']} {row['target']:g}x"


def lines(docs: dict[str, dict]) -> list[str]:
    """The table as text: one line per setting (greedy-scaled with output bases alone)."""
    energy, output = ({setting(r): r for r in docs[b]["rows"]} for b in BASES)
    base = docs["output"]["evaluation"]
    out = [f"model: {docs['output']['model']}",
           f"evaluation: {base.get('sequences')} sequences, {base.get('tokens')} tokens; "
           f"full-cache loss {docs['output']['rows'][0]['loss']:.4f} nats/token",
           f"{'setting':<20}{'ratio (e/o)':>15}{'dloss energy':>14}{'dloss output':>14}"
           f"{'energy/output':>15}  ranks (output)"]
    for name, o in output.items():
        if name == "full":
            continue
        e = energy.get(name)  # none for greedy-scaled: its gains need output bases
        e_ratio, e_loss = ("-", "-") if e is None else (f"{e['ratio']:.2f}x",
                                                        f"{e['delta_loss']:+.4f}")
        quotient = (e["delta_loss"] / o["delta_loss"] if e is not None and o["delta_loss"] > 0
                    else float("nan"))
        out.append(f"{name:<20}{e_ratio:>7}/{o['ratio']:>6.2f}x{e_loss:>14}"
                   f"{o['delta_loss']:>+14.4f}{quotient:>15.2f}  {o['ranks_summary']}")
    seconds = " + ".join(f"{docs[b]['bench_seconds']:.0f} s" for b in BASES)
    out.append(f"time: {seconds} (energy + output, each one calibration and every setting)")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", nargs="?", help="RUN_DIR/<variant> (or --hf)")
    p.add_argument("--hf", help="a Hugging Face model directory")
    p.add_argument("--text", help="--hf: calibration text")
    p.add_argument("--eval-text", help="--hf: evaluation text")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--calib-size", type=int, default=8)
    p.add_argument("--eval-size", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--no-bos", action="store_true")
    p.add_argument("--ratios", default="1.14,1.33,2",
                   type=lambda s: tuple(float(x) for x in s.split(",")))
    args = p.parse_args(argv)
    if bool(args.hf) == bool(args.run):
        p.error("name RUN_DIR/<variant> or --hf MODEL_DIR (one of them)")
    if args.hf and not (args.text and args.eval_text):
        p.error("--hf needs --text CALIB and --eval-text EVAL")
    print("\n".join(lines(measure_both(args))))


if __name__ == "__main__":
    main()
