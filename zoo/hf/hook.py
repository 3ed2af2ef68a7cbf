"""Run a function right after a named module finishes loading, without importing it:
a finder on `sys.meta_path` that wraps the real loader of the modules it watches.

zoo/hf/__init__.py uses it to register rankzoo's classes with transformers' Auto classes
when (and only when) a program imports them, so `import zoo` stays free of transformers'
two-second import. Measured with `python -X importtime -c "import zoo"`: zoo.hf and this
finder add about a millisecond (1.0 ms cumulative, of ~0.8 s for torch and the blocks).
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

CONFIG_MODULE = "transformers.models.auto.configuration_auto"  # AutoConfig
MODEL_MODULE = "transformers.models.auto.modeling_auto"  # AutoModelForCausalLM


class _ThenCall(importlib.abc.Loader):
    """The real loader, then `then()` once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.then()
        except Exception as e:  # a failed registration must not break the import it follows
            warnings.warn(f"rankzoo: not registered with transformers' Auto classes "
                          f"({type(e).__name__}: {e})", stacklevel=2)


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the finders after it for the
    spec and wraps that spec's loader, so the module loads as it would have."""

    def __init__(self, hooks: dict[str, Callable[[], None]]):
        self.hooks = dict(hooks)

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        rest = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
        for finder in rest:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenCall(spec.loader, self.hooks.pop(name))
                if not self.hooks:
                    sys.meta_path.remove(self)  # nothing left to watch
                return spec
        return None


def after_import(hooks: dict[str, Callable[[], None]]) -> None:
    """Call hooks[name]() right after module `name` is first imported (once)."""
    if any(isinstance(f, AfterImport) for f in sys.meta_path):
        return  # installed already (zoo imported twice under importlib.reload)
    sys.meta_path.insert(0, AfterImport(hooks))
