"""The zoo's models as Hugging Face models: `AutoConfig` and `AutoModelForCausalLM` know
model_type "rankzoo" once `zoo` is imported (as fla registers its models), so a directory
that `rankzoo export` wrote loads with `AutoModelForCausalLM.from_pretrained(dir)`,
generates through each block's own cache and feeds lm-evaluation-harness.

transformers is an optional extra (`pip install 'rankzoo[hf]'`) and costs about 2 s to
import, so `import zoo` does not import it: `install()` puts a small finder on
`sys.meta_path` (zoo/hf/hook.py) that registers the two classes right after transformers'
own Auto modules finish loading, or at once where they are loaded already. The classes
themselves are zoo/hf/config.py (`RankzooConfig`) and zoo/hf/modeling.py
(`RankzooForCausalLM`, around zoo/lm.py's `DecoderLM`, the LM the harness trains).
"""

from __future__ import annotations

import sys

from .hook import CONFIG_MODULE, MODEL_MODULE, after_import

MODEL_TYPE = "rankzoo"


def register_config() -> None:
    """RankzooConfig with AutoConfig (imports transformers' config machinery only)."""
    from transformers import AutoConfig

    from .config import RankzooConfig
    AutoConfig.register(MODEL_TYPE, RankzooConfig, exist_ok=True)


def register() -> None:
    """RankzooConfig with AutoConfig, RankzooForCausalLM with AutoModelForCausalLM."""
    from transformers import AutoModelForCausalLM

    from .config import RankzooConfig
    from .modeling import RankzooForCausalLM
    register_config()
    AutoModelForCausalLM.register(RankzooConfig, RankzooForCausalLM, exist_ok=True)


def install() -> None:
    """Register now where transformers' Auto modules are loaded, else right after they
    load; without transformers installed nothing is ever registered, and nothing fails."""
    if MODEL_MODULE in sys.modules:
        register()
        return
    if CONFIG_MODULE in sys.modules:
        register_config()
    after_import({CONFIG_MODULE: register_config, MODEL_MODULE: register})


__all__ = ["MODEL_TYPE", "install", "register"]
