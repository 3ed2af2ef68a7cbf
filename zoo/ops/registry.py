"""Kernel backend registries: one per operation, each backend one function signature.

A backend says whether it is installed (`unavailable()` really imports the extension: an
installed package whose CUDA extension fails to import is not available) and whether it can
serve a given call (`unsupported(spec)`, device, dtype, head dim, window, grad ...). Both
return a reason string, or None when all is well. `auto` walks a per-device preference list;
an explicitly requested backend that cannot serve raises with its reason.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rankzoo")


class BackendUnavailable(RuntimeError):
    """A backend asked for by name cannot serve a call here (the message says why)."""


@dataclass(frozen=True)
class Backend:
    name: str
    fn: Callable[..., Any]
    unavailable: Callable[[], str | None]  # why it cannot load here, or None
    unsupported: Callable[[Any], str | None]  # why it cannot serve this spec, or None


def import_probe(*modules: str) -> Callable[[], str | None]:
    """An `unavailable` check that tries to import each module once and caches the answer."""

    @functools.cache
    def probe() -> str | None:
        for module in modules:
            try:
                __import__(module)
            except Exception as err:  # ImportError, or a CUDA extension failing to load
                return f"cannot import {module}: {type(err).__name__}: {err}"
        return None

    return probe


def always_available() -> str | None:
    return None


class OpRegistry:
    def __init__(self, op: str, preference: dict[str, list[str]]):
        self.op = op
        self.preference = preference  # device type -> backend names, best first
        self._backends: dict[str, Backend] = {}
        self._logged: set[tuple[str, str]] = set()

    def register(self, backend: Backend) -> Backend:
        self._backends[backend.name] = backend
        return backend

    def names(self) -> list[str]:
        return list(self._backends)

    def get(self, name: str) -> Backend:
        if name not in self._backends:
            raise ValueError(f"unknown {self.op} backend {name!r}; known: "
                             f"{['auto', *self._backends]}")
        return self._backends[name]

    def check(self, name: str) -> None:
        """For config validation: `auto` or a registered name, else ValueError naming it."""
        if name != "auto":
            self.get(name)

    def available(self) -> dict[str, str | None]:
        """backend name -> None if it loads on this machine, else the reason it does not."""
        return {name: b.unavailable() for name, b in self._backends.items()}

    def why_not(self, name: str, spec: Any) -> str | None:
        backend = self.get(name)
        return backend.unavailable() or backend.unsupported(spec)

    def resolve(self, requested: str, spec: Any) -> Backend:
        if requested != "auto":
            reason = self.why_not(requested, spec)
            if reason:
                raise BackendUnavailable(
                    f"{self.op} backend {requested!r} cannot serve {spec}: {reason}")
            return self.get(requested)
        for name in self.preference.get(spec.device_type, ["reference"]):
            if name in self._backends and self.why_not(name, spec) is None:
                self._log_choice(name, spec.device_type)
                return self._backends[name]
        raise BackendUnavailable(f"no {self.op} backend can serve {spec}")

    def _log_choice(self, name: str, device_type: str) -> None:
        if (name, device_type) not in self._logged:
            self._logged.add((name, device_type))
            log.info("rankzoo: %s backend 'auto' chose %r on %s", self.op, name, device_type)
