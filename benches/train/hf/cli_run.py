"""What the Hugging Face benchmarks share: a probe text, and `rankzoo report --hf` run in
this process with its output captured.

    text = probe_text(root)                              # 4000 printable bytes, seeded
    code, doc, problems = report_hf(model_dir, text, seq_len=64, probe_size=1)
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch

from train.cli import main as cli


def probe_text(root: Path) -> Path:
    """root/text.txt: 4000 printable bytes, seeded (the tests' probe text)."""
    text = root / "text.txt"
    g = torch.Generator().manual_seed(0)
    text.write_bytes(bytes(torch.randint(32, 127, (4000,), generator=g).tolist()))
    return text


def report_hf(path: Path, text: Path, seq_len: int, probe_size: int
              ) -> tuple[int, dict | None, list[str]]:
    """`rankzoo report --hf PATH --format json` on the CPU: its exit code, its document
    (None unless it exits 0), and its error and traceback lines."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(["report", "--hf", str(path), "--text", str(text), "--seq-len",
                    str(seq_len), "--probe-size", str(probe_size), "--format", "json",
                    "--device", "cpu"])
    problems = [x for x in err.getvalue().splitlines()
                if x.startswith("rankzoo: error:") or "Traceback" in x]
    return code, json.loads(out.getvalue()) if code == 0 else None, problems
