"""End to end: the draft model on the first PP stage (``VLLM_PPSPEC_DRAFTER_STAGE=first``).

runner/drafter/first_stage.py: under sync scheduling the first rank drafts at
the start of each step, the drafts travel with the intermediate tensors, the
last rank verifies them and proposes placeholders only. Oracle: PP=1 without
spec (vLLM's own worker). The copy drafter must be accepted exactly as planted
(placeholders or drafts lost on the way would be rejected: the target never
emits token 0 here), the random one mostly rejected; the drafter's weights are
on the first rank and on no other. Async scheduling keeps the drafter on the
last stage and says why.
"""

from __future__ import annotations

import pytest

from tests.acceptance import check_acceptance
from tests.engine_jobs import job, run_job
from vllm_ppspec_tools.fixtures.probes import checkpoint_embedding_digest
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

pytestmark = pytest.mark.e2e

K = 3
FIRST = {"VLLM_PPSPEC_DRAFTER_STAGE": "first"}
ON_FIRST = "the draft model runs on the first PP stage"


@pytest.mark.parametrize("drafter,pp", [("draft_copy", 2), ("draft_copy", 3), ("draft_random", 2)])
def test_a_draft_model_on_the_first_stage_matches_pp1_without_spec(pp1_greedy, models, drafter, pp):
    target, spec = tiny_spec(models, drafter, K)
    res = run_job(
        job(
            models[target],
            pp=pp,
            spec=spec,
            env=FIRST,
            probe_drafter_embedding=True,
            probe_target_layers=True,
        )
    )
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == pp1_greedy[target]
    check_acceptance(drafter, res.result["spec"])
    assert res.log.count(ON_FIRST) == 1, res.log[-4000:]
    digests = res.result["probes"]["drafter_embedding_digest"]
    assert digests == [checkpoint_embedding_digest(spec["model"])] + [None] * (pp - 1), digests
    # The split follows the drafter: the last stage holds at least vLLM's share.
    layers = [end - start for start, end in res.result["probes"]["target_layers"]]
    assert sum(layers) == 4 and layers[-1] >= layers[0], layers


def test_async_scheduling_keeps_the_drafter_on_the_last_stage_and_says_why(pp1_greedy, models):
    target, spec = tiny_spec(models, "draft_copy", K)
    res = run_job(
        job(
            models[target],
            pp=2,
            spec=spec,
            async_scheduling=True,
            env=FIRST,
            probe_drafter_embedding=True,
        )
    )
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == pp1_greedy[target]
    check_acceptance("draft_copy", res.result["spec"])
    assert "the drafter runs on the last stage: async scheduling" in res.log
    assert ON_FIRST not in res.log
    digests = res.result["probes"]["drafter_embedding_digest"]
    assert digests == [None, checkpoint_embedding_digest(spec["model"])], digests


def test_a_draft_model_on_the_first_stage_follows_a_k_schedule_down_to_zero(pp1_greedy, models):
    """K = 3 for a batch of one request, 0 (no draft slots) for larger ones: the
    first stage drafts as many as the scheduler gave slots, and keeps its KV
    cache filled through the rounds without drafts (a pass with K = 0), so the
    copy drafter is still accepted every time it drafts."""
    from tests.acceptance import planted_counts
    from tests.engine_jobs import GREEDY_REQUESTS

    target, spec = tiny_spec(
        models, "draft_copy", K, num_speculative_tokens_per_batch_size=[[1, 1, K], [2, 64, 0]]
    )
    res = run_job(job(models[target], pp=2, spec=spec, env=FIRST))
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == pp1_greedy[target]
    assert res.log.count(ON_FIRST) == 1
    got = res.result["spec"]
    _, every_round = planted_counts("draft_copy", GREEDY_REQUESTS, K)
    assert 0 < got["drafts"] < every_round, got  # rounds of K = 3 and of K = 0 ran
    assert got["accepted"] == got["drafts"], got
