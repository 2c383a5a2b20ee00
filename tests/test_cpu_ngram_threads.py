"""vLLM's ngram proposer leaves a CPU worker's OpenMP thread count alone once
the plugin's worker installed patches/worker/cpu_ngram_threads.py (and changes it
without: the slowdown the patch exists for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# As in a CPU worker: torch bound to 1 thread, numba's default count 2 (the
# cores of the machine), then vLLM's NgramProposer built and asked for drafts.
SCRIPT = """
import json, sys
from types import SimpleNamespace
import numpy as np, torch
torch.set_num_threads(1)
if sys.argv[1] == "installed":
    from vllm_ppspec.patches.worker import cpu_ngram_threads
    cpu_ngram_threads.install()
from vllm.v1.spec_decode.ngram_proposer import NgramProposer
config = SimpleNamespace(
    speculative_config=SimpleNamespace(prompt_lookup_min=2, prompt_lookup_max=3,
                                       num_speculative_tokens=3),
    model_config=SimpleNamespace(max_model_len=64),
    scheduler_config=SimpleNamespace(max_num_seqs=4),
    parallel_config=SimpleNamespace(tensor_parallel_size=1),
)
proposer = NgramProposer(config)
before = torch.get_num_threads()
tokens = np.zeros((4, 64), dtype=np.int32)
tokens[0, :8] = [1, 2, 3, 4, 5, 1, 2, 3]  # "1 2 3" seen before: propose "4 5 1"
drafts = proposer.propose(3, [[3]], np.array([8, 0, 0, 0], dtype=np.int32), tokens)
print(json.dumps({"before": before, "after": torch.get_num_threads(), "drafts": drafts}))
"""


def _run(mode: str) -> dict:
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = f"{REPO / 'src'}:{env.get('PYTHONPATH', '')}"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_proposer_keeps_the_workers_thread_count_with_the_patch():
    got = _run("installed")
    assert got["drafts"] == [[4, 5, 1]]  # the proposer still proposes
    assert got["before"] == got["after"] == 1


def test_without_the_patch_the_proposer_raises_the_thread_count():
    got = _run("vllm")
    assert got["drafts"] == [[4, 5, 1]]
    assert got["before"] == 1 and got["after"] == 2
