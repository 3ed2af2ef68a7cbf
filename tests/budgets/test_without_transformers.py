"""The capture of mixer calls and the probe of any model work where transformers is not
installed: budgets/capture/ and budgets/probe/ never import it (only budgets/hf/ does)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["transformers"] = None  # any `import transformers` now raises ImportError
    import torch
    import budgets
    import budgets.capture.attention, budgets.capture.mixer, budgets.capture.projections
    import budgets.capture.sdpa, budgets.probe.calls, budgets.probe.own
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).view(1, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y.transpose(1, 2).reshape(1, 8, 16)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.attn, self.head = nn.Embedding(32, 16), Attention(), nn.Linear(16, 32)

        def forward(self, idx):
            return self.head(self.attn(self.emb(idx)))

    probe, _ = budgets.probe_torch_model(LM(), torch.arange(8)[None])
    assert [ly["name"] for ly in probe["layers"]] == ["attn"], probe["layers"]
    assert "transformers" not in {m.split(".")[0] for m in sys.modules if sys.modules[m]}
    print("ok")
""")


def test_capture_and_probe_run_without_transformers():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
