"""Fixtures of the Hugging Face capture tests that run the CLI: a text to probe, and tiny
models saved once per module."""

from __future__ import annotations

import pytest
import torch

from tests.hf_tiny import tiny_model


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """4000 printable bytes, seeded."""
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    g = torch.Generator().manual_seed(0)
    path.write_bytes(bytes(torch.randint(32, 127, (4000,), generator=g).tolist()))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """saved(model_type) -> the directory of its tiny model, saved on first use."""
    root = tmp_path_factory.mktemp("hf")

    def save(model_type: str):
        path = root / model_type
        if not path.exists():
            tiny_model(model_type).save_pretrained(path)
        return path
    return save
