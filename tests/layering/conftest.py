"""The project's import graph, read once for the layering tests."""

from __future__ import annotations

import pytest

from tests.layering.checker import ROOT, Edge, import_edges


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(ROOT)
