"""Bad command-line values are one `rankzoo: error:` line and exit 2, checked before
anything is allocated or measured: layer ranges, budgets past any machine (1e999), an
empty --plot directory."""

import subprocess
import sys
import textwrap

import pytest

from tests.train.cli.test_fuzz import run_cli

PICK = ["pick", "--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--seq-len", "16"]


@pytest.mark.parametrize("argv,named", [
    ([*PICK, "--cache-budget", "1e999"], "--cache-budget 1e999: too large"),
    ([*PICK, "--cache-budget", "1MiB", "--params-budget", "1e999"],
     "--params-budget 1e999: too large"),
    ([*PICK, "--cache-budget", "1MiB", "--flops-budget", "1e999GFLOPs"],
     "--flops-budget 1e999GFLOPs: too large"),
    ([*PICK, "--cache-budget", "18446744073709551616"], "--cache-budget 18446744073709551616"),
    (["report", "somewhere", "--plot", ""], "argument --plot: expected a directory, got ''"),
    (["compress", "somewhere", "--plot", ""], "argument --plot: expected a directory, got ''"),
])
def test_one_line_naming_the_flag(tmp_path, argv, named):
    code, out, err = run_cli(argv, tmp_path)
    assert code == 2 and out == "", err
    assert "Traceback" not in err and named in err, err
    assert not any(tmp_path.iterdir())


def test_a_huge_layer_range_is_refused_within_a_small_memory_limit(tmp_path):
    """0-99999999999 once took 24 GB before anything was checked: here the whole command,
    in a process limited to 2 GiB of data beyond what it starts with (so that a regression
    is a MemoryError here, not the test run killed), ends with the one line."""
    script = textwrap.dedent("""
        import resource, sys
        from train.cli import main
        used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        resource.setrlimit(resource.RLIMIT_DATA, (used + 2 * 2**30, resource.RLIM_INFINITY))
        sys.exit(main(["report", "--hf", "/nonexistent", "--text", "X",
                       "--layers", "0-99999999999"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--layers 0-99999999999: layer 99999999999 is past any model's layers" \
        in proc.stderr and "Traceback" not in proc.stderr
