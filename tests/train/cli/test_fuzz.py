"""Property-based fuzzing (hypothesis) of everything rankzoo reads: configs and overrides,
every file of a run directory, and tensors into every block.

Invariants, for the CLI (called in-process through train.cli.main):
  - exit 0, or exit 2 with exactly one `rankzoo: error:` line on stderr, never a traceback;
  - nothing written outside the run directory (the working directory stays empty, a
    dry run creates no run directory);
  - nothing in an existing run changed: `report` is read-only, and `train` without
    --overwrite or --resume refuses an existing run before touching it.
For the blocks: a result of the right shape, or a ValueError/TypeError with a message;
never an IndexError or RuntimeError from deep inside. NaN or inf in the input may come
out as NaN in the output (nothing is masked), but it is no crash.

The default budget (FAST: 50 examples a property, 150 for the blocks, 4 for `train` on an
existing run) keeps this file well under a minute (about 10 s on 2 cores); `pytest -m
slow` runs the same properties on 200 examples each, unseeded (LONG), plots included, and
resumes corrupted runs (about 2 minutes).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import resource
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import zoo
from tests.train.conftest import tiny_experiment
from tests.train.conftest import write_run as write_run_dir
from train.cli import COMMANDS, main

FAST = settings(max_examples=50, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

TINY = tiny_experiment(
    data={"vocab_size": 16, "seq_len": 8, "batch_size": 4}, model={"n_layers": 2},
    variants={"ssm": {"block": "ssm", "d_state": 4}},
    train={"max_steps": 4, "val_every_n_steps": 2, "checkpoint_every_n_steps": 2},
    monitor={"every_n_steps": 2, "histograms": None})


# ---------------------------------------------------------------- running the CLI

def run_cli(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    """main(argv) in-process from `cwd`: (exit code, stdout, stderr); argparse's exits
    count as exit codes."""
    out, err = io.StringIO(), io.StringIO()
    with chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def chdir(path: Path):
    """contextlib.chdir, which Python 3.10 lacks."""
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def assert_clean_exit(code: int, err: str) -> None:
    """Exit 0, or exit 2 with exactly one error line; never a traceback."""
    event(f"exit {code}")  # --hypothesis-show-statistics: the mixture of good and bad
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("rankzoo: error:")]
    assert code in (0, 2), (code, err)
    assert len(errors) == (1 if code == 2 else 0), err


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
            for p in sorted(root.rglob("*"))}


@contextlib.contextmanager
def scratch():
    """A fresh directory per example (hypothesis reuses function-scoped fixtures)."""
    path = Path(tempfile.mkdtemp(prefix="rankzoo-fuzz-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- generated values

SCALARS = (st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0, 64, 2**31])
           | st.floats(allow_nan=True, allow_infinity=True, width=32)
           | st.text(max_size=6))
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3)
                      | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=5)


def mutate(doc, data, depth: int = 0):
    """`doc` with one node replaced by a generated value or deleted, chosen by walking
    down from the root (deeper is likelier)."""
    if not isinstance(doc, (dict, list)) or not doc or data.draw(st.integers(0, 4)) == 0:
        return data.draw(VALUES)
    key = data.draw(st.sampled_from(list(doc) if isinstance(doc, dict) else range(len(doc))))
    if data.draw(st.integers(0, 3)) == 0:
        del doc[key]
    else:
        doc[key] = mutate(doc[key], data, depth + 1)
    return doc


def corrupt_bytes(data_bytes: bytes, data) -> bytes:
    """Truncated, binary, spliced, or emptied."""
    kind = data.draw(st.sampled_from(["truncate", "binary", "splice", "empty"]))
    if kind == "truncate":
        return data_bytes[:data.draw(st.integers(0, max(0, len(data_bytes) - 1)))]
    if kind == "binary":
        return data.draw(st.binary(min_size=1, max_size=64))
    if kind == "splice":
        at = data.draw(st.integers(0, len(data_bytes)))
        return data_bytes[:at] + data.draw(st.binary(min_size=1, max_size=8)) + data_bytes[at:]
    return b""


def corrupt_structure(path: Path, data) -> bytes:
    """A wrong type or a missing key somewhere in the document, or a line of ranks.jsonl
    dropped, doubled or mutated; written back in the file's own format."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        lines = text.splitlines()
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["mutate", "drop", "double"]))
        if op == "drop":
            del lines[i]
        elif op == "double":
            lines.insert(i, lines[i])
        else:
            lines[i] = json.dumps(mutate(json.loads(lines[i]), data))
        return ("\n".join(lines) + "\n").encode()
    if path.suffix == ".json":
        return json.dumps(mutate(json.loads(text), data)).encode()
    return yaml.safe_dump(mutate(yaml.safe_load(text), data)).encode()


# ---------------------------------------------------------------- a run directory

def write_run(root: Path, raw: dict = TINY) -> Path:
    """A finished-looking run (conftest.write_run) with sweep.json and mha's spectra."""
    return write_run_dir(root, raw, steps=(2, 4), spectra=True, sweep=True)


RUN_FILES = ["experiment.yaml", "sweep.json", "mha/report.json", "mha/ranks.jsonl",
             "mha/config.yaml", "ssm/report.json", "ssm/ranks.jsonl", "ssm/config.yaml"]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("template"))


def corrupt_run(run: Path, data) -> None:
    """One or two files of the run corrupted, structurally or byte-wise, or removed."""
    for name in data.draw(st.lists(st.sampled_from(RUN_FILES), min_size=1, max_size=2,
                                   unique=True)):
        path = run / name
        if not path.is_file():  # a trained run that is no sweep has no sweep.json
            continue
        how = data.draw(st.sampled_from(["structure", "structure", "bytes", "remove"]))
        if how == "remove":
            path.unlink()
        else:
            path.write_bytes(corrupt_structure(path, data) if how == "structure"
                             else corrupt_bytes(path.read_bytes(), data))


def report_property(template: Path, data, plots: bool = False) -> None:
    """`report` on a copy of the run with one or two files corrupted (with `plots`, also
    `--plot DIR` now and then: figures go into DIR and nowhere else)."""
    with scratch() as root:
        run = root / "runs" / "tiny"
        shutil.copytree(template, run)
        corrupt_run(run, data)
        cwd = root / "cwd"
        cwd.mkdir()
        before = snapshot(root / "runs")
        target = run / data.draw(st.sampled_from(["", "mha", "ssm"]))
        fmt = data.draw(st.sampled_from(["table", "json", "md"]))
        plot = ["--plot", root / "plots"] if plots and data.draw(st.integers(0, 3)) == 0 else []
        code, out, err = run_cli(["report", target, "--format", fmt, *plot], cwd)
        assert_clean_exit(code, err)
        if code == 0 and fmt == "json":
            json.loads(out)  # one JSON document, nothing else
        assert snapshot(root / "runs") == before  # report never writes
        assert not any(cwd.iterdir())
        assert {p.name for p in root.iterdir()} <= {"runs", "cwd", "plots"}
        assert all(p.suffix == ".png" for p in root.glob("plots/*"))


@FAST
@given(data=st.data())
def test_report_on_corrupted_runs(template, data):
    report_property(template, data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_report_on_corrupted_runs_long(template, data):
    report_property(template, data, plots=True)


def refuse_property(template: Path, data) -> None:
    """`train` on an existing (and perhaps corrupted) run without --overwrite or --resume:
    exit 2, the run exactly as it was."""
    with scratch() as root:
        run = root / "runs" / "tiny"
        shutil.copytree(template, run)
        corrupt_run(run, data)
        config = root / "tiny.yaml"
        config.write_text(yaml.safe_dump(TINY))
        cwd = root / "cwd"
        cwd.mkdir()
        before = snapshot(root / "runs")
        code, _, err = run_cli(["train", config, "--runs-dir", root / "runs"], cwd)
        assert_clean_exit(code, err)
        assert code == 2 and "already exists" in err
        assert snapshot(root / "runs") == before and not any(cwd.iterdir())


@settings(FAST, max_examples=4)
@given(data=st.data())
def test_existing_runs_are_not_touched_without_a_flag(template, data):
    refuse_property(template, data)


# ---------------------------------------------------------------- configs and overrides

KEYS = {  # known keys per section, with a misspelling or two among them
    "data": ["task", "vocab_size", "seq_len", "num_kv_pairs", "train_size", "val_size",
             "batch_size", "power_a", "rank", "paths", "val_kv_pairs", "seq_lne"],
    "model": ["d_model", "n_layers", "mlp_ratio", "d_mlp", "norm", "tie_embeddings"],
    "train": ["max_steps", "optimizer", "lr", "warmup_steps", "precision", "devices",
              "accelerator", "grad_clip"],
    "monitor": ["every_n_steps", "eps", "probe_size", "probe_len"],
    "match": ["params", "state", "tolerance"],
    "variants.mha": ["block", "n_heads", "n_kv_heads", "head_dim", "backend"],
    "variants.ssm": ["block", "d_state", "n_heads", "expand", "chunk_size"],
    "block_defaults": ["n_heads", "window"],
    "sweep": ["lr", "optimizer", "seed", "select"],
    "finetune": ["ranks", "targets", "data", "train"],
}
PLAUSIBLE = st.sampled_from([0, 1, 2, 3, 4, 8, 16, 64, -1, 0.5, 1e-3, True, "adamw",
                             "softmax", "ssm", "markov", [1, 2], None, "1e-3", 10**6])
KEY = st.sampled_from([f"{s}.{k}" for s, ks in KEYS.items() for k in ks]
                      + ["name", "seed", "variants", "bogus", "data", "x.y.z"])
OVERRIDE = (st.tuples(KEY, PLAUSIBLE).map(lambda kv: f"{kv[0]}={json.dumps(kv[1])}")
            | st.tuples(KEY, st.text(max_size=6)).map(lambda kv: f"{kv[0]}={kv[1]}")
            | st.sampled_from(["=3", "a..b=1", "train.lr=[1", "data=", "seed.x=1",
                               "variants={}", "-x=1", "train.max_steps"]))


VALID_OVERRIDE = st.sampled_from([
    "train.max_steps=5", "data.seq_len=16", "model.n_layers=1", "train.lr=1e-3",
    "variants.mha.n_kv_heads=1", "match.params=true", "monitor.probe_size=4",
    "train.optimizer=muon", "data={task: markov, rank: 2}", "block_defaults.n_heads=4",
    "variants.gqa={block: softmax, n_kv_heads: 1}", "match={state: true, tolerance: 0.5}"])


def config_property(data) -> None:
    """A generated experiment (valid, or with wrong values, unknown keys, a mangled tree
    or corrupt bytes) and overrides (valid, or not) through `train --dry-run`."""
    raw = json.loads(json.dumps(TINY))
    clean = data.draw(st.booleans())  # about half the examples are valid throughout
    for _ in range(0 if clean else data.draw(st.integers(0, 3))):
        key = data.draw(KEY).split(".")
        node = raw
        for part in key[:-1]:
            node = node.setdefault(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[key[-1]] = data.draw(PLAUSIBLE | VALUES)
    raw = copy.deepcopy(raw)  # the strategies' own values (e.g. [1, 2]) stay untouched
    if not clean and data.draw(st.integers(0, 5)) == 0:
        raw = mutate(raw, data)
    overrides = data.draw(st.lists(VALID_OVERRIDE if clean else VALID_OVERRIDE | OVERRIDE,
                                   max_size=3))
    corrupt = not clean and data.draw(st.integers(0, 5)) == 0
    with scratch() as root:
        config = root / "exp.yaml"
        text = yaml.safe_dump(raw).encode()
        config.write_bytes(corrupt_bytes(text, data) if corrupt else text)
        cwd = root / "cwd"
        cwd.mkdir()
        fmt = data.draw(st.sampled_from(["table", "json"]))
        code, out, err = run_cli(["train", config, *overrides, "--dry-run", "--format", fmt,
                                  "--runs-dir", root / "runs"], cwd)
        assert_clean_exit(code, err)
        if code == 0 and fmt == "json":
            json.loads(out)
        assert not (root / "runs").exists() and not any(cwd.iterdir())


@FAST
@given(data=st.data())
def test_configs_and_overrides(data):
    config_property(data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_configs_and_overrides_long(data):
    config_property(data)


# ---------------------------------------------------------------- argument lists of every verb

# numbers as people mistype them: past float (1e999), past int64 (2^64), not numbers at all
NUMERIC = st.sampled_from([
    "1e999", "-1e999", "inf", "-inf", "nan", "NaN", ".inf", ".nan", str(2**64), str(2**63),
    str(2**32), "-1", "0", "1", "2", "0.5", "1e-999", "", " ", "1KiB", "1e999KiB", "2GFLOPs",
    "0-99999999999", "3-1", "1,2", "x"])
PICK_BASE = ["pick", "--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--seq-len", "16",
             "--cache-budget", "1MiB"]
VERB_ARGS = {  # verb -> (a cheap base argument list, the flags that take a number)
    "blocks": (["blocks", "--format", "json"], ["--d-model", "--n-heads", "--seq-len"]),
    "pick": (PICK_BASE, ["--d-model", "--n-heads", "--n-layers", "--seq-len",
                         "--cache-budget", "--params-budget", "--flops-budget",
                         "--associations", "--cache-dtype"]),
    "report": (["report", "--hf", "{root}/no-model", "--text", "{root}/no-text"],
               ["--seq-len", "--probe-size", "--eps", "--layers", "--matfree-from",
                "--k-max", "--device", "--dtype"]),
    "report-run": (["report", "{run}", "--format", "json"], ["--plot", "--seq-len"]),
    "compress": (["compress", "{root}/no-run"],
                 ["--seq-len", "--ratios", "--eps", "--length", "--tolerance",
                  "--advice-eps", "--calib-size", "--eval-size", "--batch-size",
                  "--cache-dtype", "--plot"]),
    "train": (["train", "{config}", "--dry-run", "--format", "json"],
              [f"{k}=" for k in ("seed", "model.d_model", "model.n_layers", "model.d_mlp",
                                 "model.mlp_ratio", "data.seq_len", "data.vocab_size",
                                 "data.power_a", "data.permute_seed", "data.num_kv_pairs",
                                 "data.batch_size", "train.lr", "train.max_steps",
                                 "monitor.eps", "block_defaults.n_heads", "sweep.lr")]),
}
GIB = 2**30


ERROR_LINE = re.compile(r"^rankzoo( (" + "|".join(COMMANDS) + r"))?: error: ")


def error_lines(err: str) -> list[str]:
    """`rankzoo: error:` lines, and argparse's `rankzoo <verb>: error:` ones."""
    return [line for line in err.splitlines() if ERROR_LINE.match(line)]


def argv_property(template: Path, data) -> None:
    """A verb with a few of its numeric flags (or train's overrides) given mistyped
    numbers: exit 0, or exit 2 with one error line; never a traceback, never 2 GiB more
    memory at its peak, and nothing written but what was asked (--plot's directory)."""
    verb = data.draw(st.sampled_from(sorted(VERB_ARGS)))
    base, flags = VERB_ARGS[verb]
    chosen = data.draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3, unique=True))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # bytes (Linux: KiB)
    with scratch() as root:
        config = root / "exp.yaml"
        config.write_text(yaml.safe_dump(TINY))
        run = root / "runs" / "tiny"
        shutil.copytree(template, run)
        cwd = root / "cwd"
        cwd.mkdir()
        argv = [a.format(root=root, run=run, config=config) for a in base]
        for flag in chosen:
            value = data.draw(NUMERIC)
            if flag == "--plot" and value.strip():
                value = str(root / "plots" / value.replace("/", "_"))
            argv += [flag + value] if flag.endswith("=") else [flag, value]
        before = snapshot(root / "runs")
        code, out, err = run_cli(argv, cwd)
        event(f"{verb}: exit {code}")
        assert "Traceback" not in err, err
        assert code in (0, 2) and len(error_lines(err)) == (code == 2), (argv, code, err)
        if code == 0 and "json" in argv:
            json.loads(out)
        assert snapshot(root / "runs") == before and not any(cwd.iterdir())
        assert {p.name for p in root.iterdir()} <= {"runs", "cwd", "exp.yaml", "plots"}
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak
    assert grown < 2 * GIB, (argv, grown)


@settings(FAST, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
@given(data=st.data())
def test_every_verb_takes_mistyped_numbers(template, data):
    argv_property(template, data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_every_verb_takes_mistyped_numbers_long(template, data):
    argv_property(template, data)


# ---------------------------------------------------------------- tensors into blocks

D, H = 16, 2


def presets() -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name in zoo.names():
        cls = zoo.block_class(name)
        for label, kwargs in cls.variants(D, H) if hasattr(cls, "variants") else [(name, {})]:
            out.append((label, zoo.build(name, d_model=D, n_heads=H, **kwargs)))
    return out


@pytest.fixture(scope="module")
def blocks() -> list[tuple[str, torch.nn.Module]]:
    torch.manual_seed(0)
    return presets()


DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int64, torch.bool, torch.complex64]
DIMS = st.sampled_from([0, 1, 2, 3, 5, D, D + 1])


def tensor(data) -> torch.Tensor:
    """A tensor of generated shape (rank 0 to 4, empty dims included), dtype and values
    (normal, large, NaN, inf or a mixture)."""
    shape = data.draw(st.lists(DIMS, min_size=0, max_size=4))
    if data.draw(st.integers(0, 2)):  # mostly the rank and width a block reads
        shape = [data.draw(st.integers(0, 3)), data.draw(st.integers(0, 9)),
                 data.draw(st.sampled_from([D, D, D, D - 1]))]
    dtype = data.draw(st.sampled_from(DTYPES))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    fill = data.draw(st.sampled_from(["normal", "large", "nan", "inf", "mixed"]))
    if fill == "large":
        x = x * 1e30
    elif fill in ("nan", "inf"):
        x = torch.full_like(x, math.nan if fill == "nan" else math.inf)
    elif fill == "mixed" and x.numel():
        x.view(-1)[0] = math.nan
    return x.to(dtype) if dtype.is_floating_point or dtype.is_complex else x.long().to(dtype)


def check_block_call(fn, x: torch.Tensor, expect) -> None:
    """fn(x): a tensor of the shape `expect(x)` gives, or a ValueError/TypeError that
    says something; any other exception is a bug."""
    try:
        y = fn(x)
    except (ValueError, TypeError) as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        return
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == expect(x), (y.shape, x.shape)
    if x.dtype in (torch.float32, torch.float64) and torch.isfinite(x).all() \
            and x.abs().max() < 1e6:
        assert torch.isfinite(y).all()  # finite, moderate input: finite output


def blocks_property(blocks, data) -> None:
    label, block = data.draw(st.sampled_from(blocks))
    x = tensor(data)
    n_heads = block.config.n_heads
    with torch.no_grad():
        check_block_call(block, x, lambda x: tuple(x.shape))
        check_block_call(block.mixing_matrices, x,
                         lambda x: (x.shape[0], mixing_heads(block, n_heads), x.shape[1],
                                    x.shape[1]))


def mixing_heads(block, n_heads: int) -> int:
    """Heads of the mixing matrices: the block's own count (H), from one valid call."""
    return block.mixing_matrices(torch.zeros(1, 2, D)).shape[1]


@settings(FAST, max_examples=150)
@given(data=st.data())
def test_blocks_take_any_tensor(blocks, data):
    blocks_property(blocks, data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_blocks_take_any_tensor_long(blocks, data):
    blocks_property(blocks, data)


def test_nan_input_is_no_crash(blocks):
    """Documented behaviour: NaN in, NaN (or anything) out; never an exception."""
    x = torch.randn(1, 4, D)
    x[0, 1, 3] = math.nan
    for _label, block in blocks:
        with torch.no_grad():
            assert block(x).shape == x.shape


# ---------------------------------------------------------------- resuming corrupted runs

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A run really trained (checkpoints included), for the resume properties."""
    root = tmp_path_factory.mktemp("trained")
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["train", str(config), "--runs-dir", str(root / "runs")]) == 0
    return config, root / "runs" / "tiny"


def resume_property(trained, data) -> None:
    """--resume of a corrupted finished run: exit 0 or 2 (one error line), and nothing
    written outside the run directory."""
    config, template = trained
    with scratch() as root:
        run = root / "runs" / "tiny"
        shutil.copytree(template, run)
        corrupt_run(run, data)
        cwd = root / "cwd"
        cwd.mkdir()
        code, _, err = run_cli(["train", config, "--resume", "--runs-dir", root / "runs"], cwd)
        assert_clean_exit(code, err)
        assert not any(cwd.iterdir())
        assert sorted(p.name for p in root.iterdir()) == ["cwd", "runs"]


@pytest.mark.slow
@settings(LONG, max_examples=60)
@given(data=st.data())
def test_resume_of_corrupted_runs_long(trained, data):
    resume_property(trained, data)
