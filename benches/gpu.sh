#!/usr/bin/env bash
# The GPU checks in one command, about 8 minutes on one H200 at most:
#   1. the gpu-marked tests (every fused kernel against its reference, on CUDA; -rP prints
#      what a passing test measured, e.g. the spectra's seconds per layer on the device)
#   2. python -m benches.zoo.bench_gpu: attention fwd+bwd TFLOP/s against the chip's bf16
#      peak; the fused linear-attention and SSD kernels against the chunked torch paths
#   3. python -m benches.train.harness.bench_loop on CUDA: the harness against a plain loop
#
#   bash benches/gpu.sh            # logs under $OUT if set, else under /tmp/rankzoo-gpu
#
# Each stage has its own time limit, so that one hung kernel cannot eat the others' time;
# the exit status is the first failing stage's. Without a CUDA device it says why and exits
# 0 having run nothing (tests/benches/test_gpu_script.py checks that). It runs from the
# checkout with PYTHONPATH, so a machine with torch, lightning and rich needs no install.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
logs="${OUT:-/tmp/rankzoo-gpu}"
mkdir -p "$logs"
python="${PYTHON:-python3}"

why_not=$("$python" - <<'EOF'
import torch
if not torch.cuda.is_available():
    print(f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)")
EOF
)
if [ -n "$why_not" ]; then
    echo "benches/gpu.sh: skipped: $why_not"
    exit 0
fi

status=0
stage() {  # stage NAME SECONDS COMMAND...: run it under a limit, log it, keep the first failure
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s): $*"
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$logs/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start))s"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 \
    | tee "$logs/device.log"
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    | tee -a "$logs/device.log"

stage tests 240 "$python" -m pytest -q -rP -m gpu -p no:cacheprovider tests
stage kernels 150 "$python" -m benches.zoo.bench_gpu
stage harness 90 "$python" -m benches.train.harness.bench_loop --device cuda --variant mha
exit "$status"
