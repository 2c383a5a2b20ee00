"""Run real vLLM engines (offline LLM) in fresh processes for the end-to-end tests."""

from __future__ import annotations

from typing import Any

from vllm_ppspec_tools.fixtures.jobs import JobResult, run_job

__all__ = ["JobResult", "job", "run_job"]

# Prompts of different lengths, requests finishing at different steps, and a
# prompt longer than the token budget (chunked prefill with
# max_num_batched_tokens=64). The max_tokens values are not multiples of k+1,
# so requests end inside a speculative round.
GREEDY_REQUESTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [5, 6, 7, 8, 9], "max_tokens": 37},
    {"prompt_token_ids": [30, 31, 32], "max_tokens": 13},
    {"prompt_token_ids": [100 + (7 * i) % 300 for i in range(23)], "max_tokens": 29},
    {"prompt_token_ids": [3 + (11 * i) % 500 for i in range(150)], "max_tokens": 21},
    {"prompt_token_ids": [444], "max_tokens": 6},
    {"prompt_token_ids": [17, 300, 42, 42, 17, 300], "max_tokens": 48},
]
TOKEN_BUDGET = 64

SAMPLED_REQUESTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [12, 13, 14], "max_tokens": 25, "temperature": 1.0},
    {"prompt_token_ids": [200, 201], "max_tokens": 19, "temperature": 1.0},
    {"prompt_token_ids": [7, 8], "max_tokens": 17, "temperature": 0.8, "top_p": 0.9, "top_k": 20},
]


def job(
    model: str,
    pp: int = 1,
    spec: dict[str, Any] | None = None,
    *,
    async_scheduling: bool | None = None,
    worker: str = "ppspec",
    requests: list[dict[str, Any]] | None = None,
    engine_core: str = "inproc",
    **extra: Any,
) -> dict[str, Any]:
    """One offline engine job (see ``run_offline``).

    The engine core runs in the job's process (``engine_core="inproc"``) unless
    a test asks for vLLM's default, a process of its own (``"process"``): the
    fault tests do, as ``vllm serve`` always does. That saves a vLLM start-up
    (about 10 s) per job; what a worker runs is the same either way.
    """
    return {
        "engine_core": engine_core,
        "model": model,
        "pp": pp,
        "spec": spec,
        "async_scheduling": async_scheduling,
        "worker": worker,
        "max_num_batched_tokens": TOKEN_BUDGET,
        "requests": requests if requests is not None else GREEDY_REQUESTS,
        **extra,
    }
