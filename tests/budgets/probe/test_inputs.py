"""The input collector the probes and compress share (budgets/probe/inputs.py)."""

from __future__ import annotations

import torch
from torch import nn

from budgets.probe.inputs import module_inputs


class Keyword(nn.Module):
    def forward(self, hidden_states):  # Hugging Face passes its layers' input so
        return hidden_states


def test_inputs_at_the_latest_or_first_call_and_the_hooks_removed():
    linear = nn.Linear(3, 3)
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    with (module_inputs({"l": linear}) as latest,
          module_inputs({"l": linear}, first=True, clone=True) as first):
        linear(a)
        linear(b)
    assert torch.equal(latest["l"], b) and torch.equal(first["l"], a)
    assert first["l"].data_ptr() != a.data_ptr()  # cloned
    assert not linear._forward_pre_hooks


def test_a_keyword_input_is_collected_and_a_call_without_a_tensor_is_not():
    module, x = Keyword(), torch.randn(2, 4)
    with module_inputs({0: module}) as seen:
        module(hidden_states=x)
    assert torch.equal(seen[0], x)
    with module_inputs({0: module}) as seen:
        module(hidden_states=None)
    assert seen == {}
