"""Where the tools keep what they build and write.

From a source checkout (the repository's ``pyproject.toml`` beside ``src/``):
its ``.cache/`` and ``results/``, as the README's commands expect. From an
installed package: ``$VLLM_PPSPEC_HOME`` or ``~/.cache/vllm-ppspec``, with
``cache/`` and ``results/`` inside. ``VLLM_PPSPEC_HOME`` wins in both cases.
"""

from __future__ import annotations

import os
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[2]


def _in_checkout() -> bool:
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "src").is_dir()


def home() -> Path:
    env = os.environ.get("VLLM_PPSPEC_HOME")
    if env:
        return Path(env)
    return _CHECKOUT if _in_checkout() else Path.home() / ".cache" / "vllm-ppspec"


def cache_dir(*parts: str) -> Path:
    """``.cache/...`` in a checkout, ``cache/...`` elsewhere."""
    base = home()
    return base.joinpath(".cache" if base == _CHECKOUT else "cache", *parts)


def results_dir(*parts: str) -> Path:
    return home().joinpath("results", *parts)
