"""The zoo: interchangeable causal token-mixing blocks, each declaring a rank budget.

    block = zoo.build("softmax", d_model=256, n_heads=8, n_kv_heads=2)   # GQA
    y = block(x)                                   # x, y: [B, T, D]
    declared = block.budget(seq_len=1024)          # budgets.RankBudget
    P = block.mixing_matrices(x)                   # [B, H, T, T]
"""

from . import linear, mla, moe, sliding_window, softmax, ssm  # noqa: F401  (registers the blocks)
from .block import Block
from .ops.attention import ATTENTION
from .ops.conv import CONV
from .ops.linear_attn import LINEAR_ATTN
from .ops.ssd import SSD
from .registry import block_class, build, names, register

OPS = {"attention": ATTENTION, "linear_attn": LINEAR_ATTN, "ssd": SSD, "causal_conv": CONV}


def backends_available() -> dict[str, dict[str, str | None]]:
    """op -> backend -> None if it loads on this machine, else the reason it does not."""
    return {op: registry.available() for op, registry in OPS.items()}


__all__ = ["Block", "OPS", "backends_available", "block_class", "build", "names", "register"]
