"""The README's main job: real `vllm serve` (PP=1 reference, then PP=2 + spec with
the plugin worker) queried through the OpenAI client; token ids must match."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    "method,mode",
    [("mtp", "async"), ("eagle3", "sync")],  # sync: the filled pipeline, plugin scheduler
)
def test_vllm_serve_pp2_spec_matches_pp1_through_openai_api(models, method, mode):
    extra = ["--async-scheduling"] if mode == "async" else []
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ppspec.demo", "--method", method, *extra],
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert out.count("token ids MATCH PP=1 no-spec") == 4
    assert "RESULT: all token ids match PP=1 without speculation" in out
    assert f"{mode} scheduling, worker vllm_ppspec.worker.PPSpecWorker" in out
