"""Run real vLLM engines (offline LLM) in fresh processes for the end-to-end tests:
the jobs, their requests and the runner live in :mod:`vllm_ppspec_tools.fixtures.jobs`
(scripts/profile_startup.py runs them too)."""

from vllm_ppspec_tools.fixtures.jobs import (
    GREEDY_REQUESTS,
    SAMPLED_REQUESTS,
    TOKEN_BUDGET,
    JobResult,
    job,
    run_job,
)

__all__ = ["GREEDY_REQUESTS", "SAMPLED_REQUESTS", "TOKEN_BUDGET", "JobResult", "job", "run_job"]
