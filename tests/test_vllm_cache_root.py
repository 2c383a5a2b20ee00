"""The tests keep one VLLM_CACHE_ROOT per vLLM release (tests/conftest.py), so
that the 0.32 and 0.33 runs do not make each other's cached model-class
inspections stale (each miss: a new interpreter importing vLLM)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

from tests.conftest import REPO, release_cache_root, vllm_release


def test_vllm_reads_the_tests_root_for_the_installed_release():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CACHE_ROOT"}
    out = subprocess.run(
        [sys.executable, "-c", "import tests.conftest, vllm.envs as e; print(e.VLLM_CACHE_ROOT)"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()[-1]
    assert out.endswith(f"/vllm/ppspec-tests-{vllm_release(import_vllm=False)}"), out


def test_each_release_has_its_own_root(monkeypatch):
    roots = {}
    for version in ("0.32.0", "0.33.0", "0.33.0+cpu"):
        monkeypatch.setattr(importlib.metadata, "version", lambda _name, v=version: v)
        roots[version] = release_cache_root()
    assert roots["0.32.0"] != roots["0.33.0"] == roots["0.33.0+cpu"]
