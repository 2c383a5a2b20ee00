"""References shared by several test files: each PP=1 no-spec run of vLLM's
own worker that more than one file compares against is made once per pytest
run, on first use (a pytest plugin: tests/conftest.py loads it).

- ``pp1_greedy[name]``: GREEDY_REQUESTS on ``models[name]`` (target, mimo),
  pinned to the rule the models were planted with; tests/test_e2e_pp_spec.py
  and tests/test_e2e_two_hosts.py compare against it.
- ``hybrid_pp1(fixture)``: HYBRID_REQUESTS on a hybrid target, bf16, with the
  top-1/top-2 gaps the near-tie judge needs; tests/test_e2e_hybrid.py and the
  two-host hybrid case compare against it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import MODELS_DIR
from tests.engine_jobs import GREEDY_REQUESTS, job, run_job

HYBRID_PROMPTS = [
    [444],
    [5, 6, 7, 8, 9],
    [100 + (7 * i) % 300 for i in range(17)],
    [3 + (11 * i) % 500 for i in range(40)],
    [20 + (13 * i) % 480 for i in range(90)],
    [7 + (5 * i) % 490 for i in range(33)],
]
HYBRID_MAX_TOKENS = [48, 64, 52, 49, 57, 61]  # all >= 48, ending inside speculative rounds
HYBRID_REQUESTS = [
    {"prompt_token_ids": p, "max_tokens": n, "logprobs": 2}
    for p, n in zip(HYBRID_PROMPTS, HYBRID_MAX_TOKENS, strict=True)
]
# Four sequences at a time: the last two join when earlier ones finish.
HYBRID = {
    "dtype": "bfloat16",
    "enable_prefix_caching": False,
    "max_num_seqs": 4,
    "max_num_batched_tokens": None,
}


class OnFirstUse:
    """A mapping whose values are made by ``make(key)`` the first time they are read."""

    def __init__(self, make: Callable[[str], object]):
        self._make = make
        self._made: dict[str, object] = {}

    def __getitem__(self, key: str):
        if key not in self._made:
            self._made[key] = self._make(key)
        return self._made[key]


@pytest.fixture(scope="session")
def pp1_greedy(models) -> OnFirstUse:
    """PP=1, no speculative decoding, vLLM's own worker: the oracle."""
    from vllm_ppspec_tools.fixtures.tiny_models import greedy_reference

    # Pinned to the model-free rule both models were planted with, so a broken
    # fixture or oracle cannot pass unnoticed.
    planted = [greedy_reference(r["prompt_token_ids"], r["max_tokens"]) for r in GREEDY_REQUESTS]

    def make(name: str) -> list[list[int]]:
        res = run_job(job(models[name], worker="stock"))
        assert res.returncode == 0, res.log[-6000:]
        assert res.outputs == planted, name
        return res.outputs

    return OnFirstUse(make)


@pytest.fixture(scope="session")
def hybrid(models) -> dict[str, str]:
    from vllm_ppspec_tools.fixtures.tiny_hybrid import build_hybrid

    return build_hybrid(MODELS_DIR)


@pytest.fixture(scope="session")
def hybrid_pp1(hybrid) -> Callable[[str], dict]:
    """PP=1 no-spec runs (vLLM's own worker), one per hybrid target."""
    from vllm_ppspec_tools.fixtures.tiny_hybrid import greedy_reference

    def make(target: str) -> dict:
        res = run_job(job(hybrid[target], worker="stock", requests=HYBRID_REQUESTS, **HYBRID))
        assert res.returncode == 0, res.log[-6000:]
        # The model-free rule the fixtures were built to follow; guards them.
        for req, out in zip(HYBRID_REQUESTS, res.outputs, strict=True):
            assert out == greedy_reference(req["prompt_token_ids"], req["max_tokens"])
        return res.result

    made = OnFirstUse(make)
    # hybrid_random shares hybrid_copy's target weights (only mtp.* differ).
    return lambda fixture: made[fixture.replace("hybrid_random", "hybrid_copy")]
