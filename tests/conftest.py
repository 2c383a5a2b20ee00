"""Shared fixtures: the tiny local models, built once and cached on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("PPSPEC_MODELS_DIR", REPO / ".cache" / "models"))


@pytest.fixture(scope="session")
def models() -> dict[str, str]:
    from vllm_ppspec.testing.tiny_models import build_all

    return build_all(MODELS_DIR)
