"""The zoo: interchangeable causal token-mixing blocks, each declaring a rank budget.

    block = zoo.build("softmax", d_model=256, n_heads=8, n_kv_heads=2)   # GQA
    y = block(x)                                   # x, y: [B, T, D]
    declared = block.budget(seq_len=1024)          # budgets.RankBudget
    P = block.mixing_matrices(x)                   # [B, H, T, T]
"""

# ruff: noqa: I001  (the registry rows below are in listing order, not sorted)
# The registry: one row per block family, registered in the order in which tables list
# families whose costs tie (zoo.families()). A new block is one module and one row here.
from . import softmax  # noqa: F401
from . import sliding_window  # noqa: F401
from . import mla  # noqa: F401
from . import moe  # noqa: F401
from . import linear  # noqa: F401
from . import ssm  # noqa: F401
from . import delta  # noqa: F401
from . import sparse  # noqa: F401
from .block import Block
from .ops.attention import ATTENTION
from .ops.conv import CONV
from .ops.delta import DELTA
from .ops.linear_attn import LINEAR_ATTN
from .ops.sparse import SPARSE
from .ops.ssd import SSD
from .facts import Facts
from .registry import block_class, build, families, facts_of, names, register
from . import hf

# transformers' AutoConfig and AutoModelForCausalLM know model_type "rankzoo" once they load
# (zoo/hf/__init__.py); transformers itself is not imported here
hf.install()

OPS = {"attention": ATTENTION, "linear_attn": LINEAR_ATTN, "ssd": SSD, "delta": DELTA,
       "causal_conv": CONV, "sparse": SPARSE}


def backends_available() -> dict[str, dict[str, str | None]]:
    """op -> backend -> None if it loads on this machine, else the reason it does not."""
    return {op: registry.available() for op, registry in OPS.items()}


__all__ = ["Block", "Facts", "OPS", "backends_available", "block_class", "build", "families",
           "facts_of", "names", "register"]
