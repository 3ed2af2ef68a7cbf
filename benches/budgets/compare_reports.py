"""Two JSON documents of `rankzoo report`, figure by figure: what a change of the
measuring code moved, against the tolerances docs/METRICS.md states.

    python -m benches.budgets.compare_reports BEFORE.json AFTER.json
    python -m benches.budgets.compare_reports BEFORE.json AFTER.json --rtol 1e-6

Every number of the two documents is paired by its path (lists by index): integers and
strings must be equal, floats equal to --rtol relative (of the larger magnitude, 1e-12
absolute near zero), unless docs/METRICS.md states a wider tolerance for the figure
(TOLERANCE below: path pattern -> its bound). Prints per figure, its indices collapsed
(`variants[].layers[].quantities.mixing.erank[]`), the largest relative difference and how
many values differ at all; exits 1 when any value is outside its tolerance or the two
documents differ in shape.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

# path pattern (indices collapsed) -> the relative tolerance docs/METRICS.md states.
# mixing_centered: the centered Gram is derived from the raw one in fp64 where the data
# was centered in fp32 before (docs/METRICS.md, "How the spectra are computed").
TOLERANCE = {
    r"\.mixing_centered\.(erank|stable_rank|participation_ratio|sigma_1|sigma_ratio)\[\]$": 1e-5,
    r"\.mixing_centered\.(numerical_rank|rank_eps|rank_eps_max)\[\]$": ("count", 1),
    # the report's views of them: per-layer eranks, head figures
    r"\.erank\.mixing_centered\[\]$": 1e-5,
    r"\.mixing_centered_erank$": 1e-5,
    r"\.heads\.(centered_erank|centered_energy)\[\]$": 1e-5,
}
IGNORED = (r"^source\.eigensolver",)  # what the machine chose, not a figure


def leaves(doc, path: str = ""):
    """(path, collapsed path, value) of every leaf."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, re.sub(r"\[\d+\]", "[]", path), doc


def tolerance(collapsed: str, rtol: float):
    for pattern, tol in TOLERANCE.items():
        if re.search(pattern, collapsed):
            return tol
    return rtol


def _rel(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return 0.0 if a == b else abs(a - b) / scale if scale > 1e-12 else abs(a - b)


def within(a, b, tol) -> tuple[bool, float]:
    """(inside the tolerance, the relative difference or, for counts, the difference)."""
    if isinstance(tol, tuple):  # ("count", n): whole counts that may move by n
        return abs(a - b) <= tol[1], abs(a - b)
    if isinstance(a, bool | str) or a is None or b is None:
        return a == b, 0.0 if a == b else float("inf")
    if isinstance(a, int) and isinstance(b, int):
        return a == b, float(abs(a - b))
    r = _rel(float(a), float(b))
    return r <= tol, r


def compare(before: dict, after: dict, rtol: float) -> dict:
    """{"figures": {collapsed: {"max": largest difference, "differ": n, "values": n,
    "tol": bound}}, "outside": [(path, before, after)], "missing": [...]}."""
    a = {p: (c, v) for p, c, v in leaves(before) if not any(re.search(i, p) for i in IGNORED)}
    b = {p: (c, v) for p, c, v in leaves(after) if not any(re.search(i, p) for i in IGNORED)}
    out = {"figures": {}, "outside": [], "missing": sorted(set(a) ^ set(b))}
    for path in sorted(set(a) & set(b)):
        collapsed, x = a[path]
        y = b[path][1]
        tol = tolerance(collapsed, rtol)
        ok, diff = within(x, y, tol)
        fig = out["figures"].setdefault(collapsed, {"max": 0.0, "differ": 0, "values": 0,
                                                    "tol": tol})
        fig["values"] += 1
        fig["differ"] += x != y
        fig["max"] = max(fig["max"], diff)
        if not ok:
            out["outside"].append((path, x, y))
    return out


def summary(result: dict) -> dict:
    moved = {k: v for k, v in result["figures"].items() if v["differ"]}
    worst = max((v["max"] for k, v in result["figures"].items()
                 if not isinstance(v["tol"], tuple)), default=0.0)
    return {"values": sum(v["values"] for v in result["figures"].values()),
            "values_differing": sum(v["differ"] for v in moved.values()),
            "max_relative_difference": worst,
            "moved": {k: {"max": v["max"], "differ": f"{v['differ']} of {v['values']}",
                          "tol": v["tol"]} for k, v in sorted(moved.items())},
            "outside_tolerance": result["outside"][:20],
            "n_outside": len(result["outside"]), "missing": result["missing"][:20]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.budgets.compare_reports",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rtol", type=float, default=1e-6)
    args = p.parse_args(argv)
    with open(args.before) as f, open(args.after) as g:
        result = compare(json.load(f), json.load(g), args.rtol)
    out = summary(result)
    print(json.dumps(out, indent=1))
    return 1 if out["n_outside"] or out["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
