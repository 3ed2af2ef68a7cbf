"""The README's commands, run as a user types them: from the repository root (a directory
that holds the repository's files, so that what the commands write stays out of the
checkout), with the installed `rankzoo` console script, no PYTHONPATH.

Every shell command and Python block in the README's code blocks is in RUN (run, as
written or at a smaller size the entry states) or in NOT_RUN (with the reason it cannot
run offline in seconds). A README command missing from both fails the inventory test, as
does one that ends in a traceback or a non-zero exit code. Commands run in the README's
order, in one directory, so those that read a run (`report runs/quick`) read the one the
commands before them wrote, as a reader's would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SMALL = "train.max_steps=8 train.val_every_n_steps=8 train.checkpoint_every_n_steps=8"

# README command -> (what the test runs instead, or None for the command itself; why)
RUN: dict[str, tuple[str | None, str]] = {
    "rankzoo train configs/quick.yaml": (
        f"rankzoo train configs/quick.yaml {SMALL}",
        "the main job at 8 steps a variant instead of 600 (about 110 s on 2 cores)"),
    "rankzoo blocks --d-model 1024 --n-heads 16 --seq-len 8192": (None, ""),
    "rankzoo pick --d-model 1024 --n-heads 16 --n-layers 24 --seq-len 8192 "
    "--cache-budget 256KiB --cache-dtype bf16": (None, ""),
    "rankzoo train configs/quick.yaml train.max_steps=200 variants.mqa.n_kv_heads=1 "
    "--runs-dir runs/tries": (
        f"rankzoo train configs/quick.yaml variants.mqa.n_kv_heads=1 --runs-dir runs/tries "
        f"{SMALL}", "8 steps a variant instead of 200"),
    "rankzoo report runs/quick --plot figures/": (None, "on the 8-step main job"),
    "rankzoo compress runs/quick/mha --ratios 1.5,2,4,8": (None, "on the 8-step main job"),
    "rankzoo tokenize corpus/*.txt --tokenizer tokenizer.json --out shards/": (
        None, "on a corpus/ and a tokenizer.json the test writes, standing in for the "
              "user's"),
    "rankzoo export runs/quick/mha --out models/quick-mha": (None, "on the 8-step main job"),
    "rankzoo claims --hf DIR --text README.md --seq-len 128": (
        None, "DIR: the tiny random Llama of 6 layers the README names, built offline"),
    "python -m examples.nanogpt.train": (
        "python -m examples.nanogpt.train --steps 20 --every 10",
        "20 steps instead of 300"),
    "rankzoo report --model examples.nanogpt.model:small --checkpoint runs/nanogpt/ckpt.pt "
    "--text README.md --tokenizer runs/nanogpt/tokenizer.json": (
        None, "on the 20-step checkpoint"),
    "python: import torch": (None, "the Python API block, as a script"),
}
NOT_RUN: dict[str, str] = {
    "pip install torch==2.13.0 -e .": "installs the package: .ci/run does, in a fresh venv",
    "pip install torch==2.13.0 -e '.[dev]'": "installs the package: .ci/run does",
    "python -m pytest -q": "the test suite itself: .ci/run runs it",
    "pip install torch==2.13.0 -e '.[cuda]'": "CUDA extras: builds on a GPU machine only",
    "OMP_NUM_THREADS=1 rankzoo claims runs/claims --train configs/claims/plan.yaml":
        "trains the claims' plan, 5.5 minutes on 2 cores; tests/train/commands/claims/ "
        "runs each claim on tiny runs",
    "python: from train.monitor import Monitor":
        "a fragment of the user's own loop (`...` is their step); tests/train/monitor/ "
        "runs the Monitor in loops",
}


def readme_commands(text: str) -> list[str]:
    """The README's commands, in order: each line of a bash block or of an indented
    block (continuation lines joined, comments dropped, `a && b` as two commands), and
    each Python block as `python: <its first line>`."""
    out = []
    for lang, body in code_blocks(text):
        if lang == "python":
            out.append("python: " + body.strip().splitlines()[0])
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out += [" ".join(part.split()) for part in line.split("&&")]
    return out


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block and each indented block (4 spaces after a
    blank line, outside a fence and a list), in order; an indented block is shell."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append((fence.group(1) or "text", "\n".join(lines[i + 1:end])))
            i = end + 1
        elif lines[i].startswith("    ") and i > 0 and not lines[i - 1].strip():
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            blocks.append(("bash", "\n".join(ln[4:] for ln in lines[i:end])))
            i = end
        else:
            i += 1
    return blocks


def test_every_readme_command_is_run_or_says_why_not():
    found = readme_commands(README.read_text())
    assert len(found) == len(set(found)), "a README command appears twice"
    listed = set(RUN) | set(NOT_RUN)
    assert not set(RUN) & set(NOT_RUN)
    assert [c for c in found if c not in listed] == [], \
        "README commands this test neither runs nor lists in NOT_RUN"
    assert [c for c in listed if c not in found] == [], \
        "commands listed here that the README no longer has"


def test_the_inventory_finds_what_a_reader_sees():
    text = ("```bash\n# comment\npip install x && rankzoo a \\\n    --b 1   # why\n```\n\n"
            "    rankzoo c DIR\n\n```python\nimport zoo\nx = 1\n```\n")
    assert readme_commands(text) == ["pip install x", "rankzoo a --b 1", "rankzoo c DIR",
                                     "python: import zoo"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A directory that holds the repository's files as its root does (links), where the
    commands' own writes (runs/, figures/, shards/, models/) land instead of the checkout; and
    the user's files the README names: DIR (a tiny Llama), corpus/, tokenizer.json."""
    top = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", "figures", "shards", "models", "DIR", "corpus") \
                and not entry.name.startswith("."):
            (top / entry.name).symlink_to(entry)
    return top


def user_files(top: Path) -> None:
    """The files the README's commands name as the user's own (RANKZOO_CACHE set)."""
    from tests.hf_tiny import tiny_model
    from train.data.tokenizer import trained_bpe

    tiny_model("llama", num_hidden_layers=6).save_pretrained(top / "DIR")
    (top / "corpus").mkdir()
    for name in ("a", "b"):
        (top / "corpus" / f"{name}.txt").write_text((ROOT / "README.md").read_text())
    (top / "tokenizer.json").write_bytes(trained_bpe(300, README.read_text()).read_bytes())


def environment(top: Path) -> dict:
    """A user's shell: the installed scripts on PATH, no PYTHONPATH, caches of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["RANKZOO_CACHE"] = str(top / ".cache")
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "2")
    return env


def test_the_readme_commands_run_as_typed(root, monkeypatch):
    monkeypatch.setenv("RANKZOO_CACHE", str(root / ".cache"))
    env = environment(root)
    user_files(root)
    failures = []
    python_blocks = {"python: " + body.strip().splitlines()[0]: body
                     for lang, body in code_blocks(README.read_text()) if lang == "python"}
    for command in readme_commands(README.read_text()):
        if command not in RUN:
            continue
        instead = RUN[command][0] or command
        argv = ([sys.executable, "-c", python_blocks[command]] if command in python_blocks
                else ["bash", "-c", instead])
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0 or "Traceback" in done.stderr:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            failures.append(f"{instead}: exit {done.returncode}\n{tail}")
    assert not failures, "\n\n".join(failures)
