"""Measuring a model on one fixed batch: its probeable blocks found and measured
(blocks.py), the captured mixer calls of any other model measured inside one forward
(calls.py: probe_calls, fed by sources such as budgets/hf/capture.py), where each head puts
its weight (heads.py), and what flows between the blocks: the residual stream and the keys
and values per KV head (streams.py)."""
