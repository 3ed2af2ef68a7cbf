"""benches/gpu.sh, the GPU checks in one command: without a CUDA device it starts, says why
it skips and exits 0; its stages name modules that exist, within its 8-minute promise."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benches" / "gpu.sh"
STAGE = re.compile(r'^stage (\w+) (\d+) "\$python" -m (\S+)', re.M)


def stages() -> list[tuple[str, int, str]]:
    return [(name, int(limit), module) for name, limit, module in STAGE.findall(
        SCRIPT.read_text())]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the script "
                    "would run its checks (minutes), not skip")
def test_without_cuda_the_script_skips_with_its_reason(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "benches/gpu.sh: skipped: no CUDA device" in done.stdout
    assert "torch.cuda.is_available() is False" in done.stdout
    assert not list(tmp_path.iterdir())  # it ran no stage, so it logged none


def test_the_stages_exist_and_fit_in_eight_minutes():
    found = stages()
    assert [name for name, _, _ in found] == ["tests", "kernels", "harness"]
    for _, _, module in found:
        if module != "pytest":
            assert importlib.util.find_spec(module) is not None, module
    assert sum(limit for _, limit, _ in found) <= 8 * 60
