"""How exactly each linear mixer's M reproduces its Hugging Face module, on the tiny random
fp64 models the tests build offline (tests/hf_tiny.py):

    python -m benches.budgets.mixer_errors

Per model type, the layers one capture reads and the largest relative error
max |readout(M @ V) - output| / max |output| over them. The delta rule's chunk functions
compute in fp32 whatever the model's dtype, so their M agrees to fp32's precision; the
short convolution and lightning attention run in fp64 and agree to its.
"""

from __future__ import annotations

from budgets.hf.delta import capture_delta
from budgets.hf.hooked import capture_hooked
from tests.budgets.hf.mixer_checks import captured, relative

SOURCES = {"qwen3_next": capture_delta, "qwen3_5_text": capture_delta,
           "olmo_hybrid": capture_delta, "kimi_linear": capture_delta,
           "lfm2": capture_hooked, "recurrent_gemma": capture_hooked, "minimax": capture_hooked}


def main() -> None:
    for model_type, source in SOURCES.items():
        calls = captured(model_type, [source])
        error = max(relative(c.readout(c.exact() @ c.values()), c.output) for c in calls)
        label = calls[0].kind(False)["label"]
        print(f"{model_type:16s} {len(calls)} layers ({label}): largest relative error "
              f"{error:.1e}")


if __name__ == "__main__":
    main()
