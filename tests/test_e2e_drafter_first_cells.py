"""End to end: the draft model on the first PP stage in the cells a filled pipeline meets.

``VLLM_PPSPEC_DRAFTER_STAGE=first`` (runner/drafter/first_stage.py), sync
scheduling, the copy drafter (planted to be accepted every time the drafter's
cache and the drafts it is given are right). One engine per line shares its
start-up between the cells (docs/testing.md):

* preemption: the load test's 16 requests through a KV cache of 5 blocks of
  128 tokens (tests/test_e2e_load.py); a preempted request comes back with its
  cached prefix, which may end inside its prompt;
* chunked prefill: a 64-token budget chunks the long prompts;
* prefix-cache hits: a request whose 256 first tokens an earlier one left in
  the prefix cache (the ``then`` lists run one after another on one engine);
* penalties: greedy requests with repetition, presence and frequency
  penalties, which the last rank's sampler applies over the drafts it was sent;
* one batch in flight (``VLLM_PPSPEC_ONE_BATCH=1``) and PP batches;
* adaptive K and the measured layer split together;
* TP = 2 x PP = 2 (four ranks): the drafts ride in the intermediate tensors,
  which vLLM's PP send slices for the TP group's all-gather where their size
  divides by the TP size (protocol/draft_tensor.encode keeps them whole).

Oracle: every token id equals vLLM's own worker at PP=1 without spec, on the
same requests. Acceptance: the copy drafter is accepted almost always (a
preempted request's recomputation drops its drafts, as in the load test).

The far pair (``far`` + ``far_copy``, tests at the end) reads the context
200 positions back, the target and its copy drafter alike: a hole in the
drafter's cache of a chunked prompt or of a cached prefix rejects drafts,
and a wrong id deep in a re-joining request's context changes the target's
tokens. Planted breaks, each failing the far test: a prompt's non-last
chunks run no drafter pass (drafts rejected, both lines); the drafter's
cache is lost once the requests holding it finish (only the prefix-hit
request's drafts rejected); a preempted request whose cached prefix ends
inside its prompt re-joins without its outputs (the old condition of
``steps/sync.restore_output_tokens``: request 1's tokens differ, the
``one-preempted`` line). The copy drafter's lines above pass all three: it
reads only the current and the previous token.

What no test here can show: the penalties' context at the draft positions
(the drafts within one round) never holds a token they would change, so
zeros in the last rank's copy of the drafts leave every token as it is
(planted and tried). On CPU, vLLM's PP send within a host takes its
shared-memory path, which never slices for the TP all-gather:
tests/test_first_stage_drafter.py::test_the_drafts_never_go_through_the_tp_all_gather
carries that break.
"""

from __future__ import annotations

import pytest

from tests.engine_jobs import job, run_job
from tests.test_e2e_load import LOAD_REQUESTS
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec
from vllm_ppspec_tools.fixtures.tiny_rules import FAR

pytestmark = pytest.mark.e2e

K = 3
FIRST = {"VLLM_PPSPEC_DRAFTER_STAGE": "first"}
ON_FIRST = "the draft model runs on the first PP stage"

PENALTIES = [
    {
        "prompt_token_ids": [5 + (13 * i) % 400 for i in range(9)],
        "max_tokens": 31,
        "repetition_penalty": 1.4,
    },
    {
        "prompt_token_ids": [17, 300, 42, 42, 17, 300],
        "max_tokens": 27,
        "presence_penalty": 0.8,
        "frequency_penalty": 0.6,
    },
]
PREFIX = [3 + (29 * i) % 509 for i in range(260)]  # two blocks of 128 and 4 tokens
# Run after the load, one list after the other: the second finds the first's
# two full blocks in the prefix cache.
THEN = [
    [{"prompt_token_ids": PREFIX + [17], "max_tokens": 23}],
    [{"prompt_token_ids": PREFIX + [40, 41], "max_tokens": 19}],
]
CELLS = {
    "requests": LOAD_REQUESTS + PENALTIES,
    "then": THEN,
    "max_num_seqs": 8,
    "num_kv_blocks": 5,
    "enable_prefix_caching": True,
}
BLOCK = 128  # the CPU backend's block size for these models


@pytest.fixture(scope="module")
def cells_pp1(models):
    res = run_job(job(models["target"], worker="stock", **CELLS))
    assert res.returncode == 0, res.log[-6000:]
    return res


def _check(res, want, tp: int = 1) -> None:
    assert res.returncode == 0, res.log[-8000:]
    assert res.log.count(ON_FIRST) == tp, res.log[-4000:]  # each first-stage rank says it
    differ = [i for i, (a, b) in enumerate(zip(res.outputs, want.outputs, strict=True)) if a != b]
    assert not differ, f"requests differing from PP=1 without spec: {differ}"
    for i, (got, base) in enumerate(zip(res.result["then"], want.result["then"], strict=True)):
        assert got["outputs"] == base["outputs"], f"then[{i}] differs from PP=1 without spec"
    # The second prefix request found the first's full blocks in the cache.
    assert res.result["then"][1]["prefix_cache_hits"] >= 2 * BLOCK, res.result["then"]
    stats = res.result["spec"]
    assert stats["drafts"] > 0 and stats["accepted"] > 0.9 * stats["drafts"], stats
    for i, then in enumerate(res.result["then"]):
        s = then["spec"]
        assert s["drafts"] > 0 and s["accepted"] == s["drafts"], (i, s)


# Each line's switches beside the drafter's stage, and what its log must say.
LINES = {
    "pp": ({}, []),
    "one": ({"VLLM_PPSPEC_ONE_BATCH": "1"}, []),
    # Adaptive K (the first stage drafts as many as each batch's slots) and the
    # measured split (each stage timed at set-up, the drafter on the first).
    "adaptive-measured": (
        {"VLLM_PPSPEC_ADAPTIVE_K": "1", "VLLM_PPSPEC_LAYER_SPLIT": "measured"},
        ["adaptive K: measuring", "(measured; vLLM's even split"],
    ),
}


@pytest.mark.parametrize("line", sorted(LINES))
def test_first_stage_drafter_through_preemption_prefix_hits_chunks_and_penalties(
    models, cells_pp1, line
):
    _, spec = tiny_spec(models, "draft_copy", K)
    switches, said = LINES[line]
    env = {**FIRST, **switches}
    res = run_job(job(models["target"], pp=2, spec=spec, env=env, **CELLS), timeout=900)
    _check(res, cells_pp1)
    assert res.result["preemptions"] > 0, "the small KV cache did not force preemption"
    for line_said in said:
        assert line_said in res.log, (line_said, res.log[-4000:])


def test_first_stage_drafter_at_tp2_by_pp2(models, cells_pp1):
    """Four ranks: each TP rank of the first stage drafts (the draft model is
    sharded as the target is) and sends its drafts whole to its peer."""
    _, spec = tiny_spec(models, "draft_copy", K)
    res = run_job(job(models["target"], pp=2, tp=2, spec=spec, env=FIRST, **CELLS), timeout=900)
    _check(res, cells_pp1, tp=2)


# The far pair (``far`` + ``far_copy``: the draft reads the drafter's cache FAR
# positions back): long prompts, chunked by the 64-token budget, and a prefix
# hit whose decode reads the cached prefix. A hole anywhere in the drafter's
# cache of a prompt shows as a rejected draft. Each prompt fits two blocks and
# its output crosses into a third: in 5 blocks, two run and one is preempted.
FAR_PREFIX = [5 + (37 * i) % 500 for i in range(FAR + 60)]  # two blocks of 128 and 4 tokens
FAR_CELLS = {
    "requests": [
        {"prompt_token_ids": [7 + (31 * i) % 500 for i in range(FAR)], "max_tokens": 230},
        {"prompt_token_ids": [11 + (13 * i) % 490 for i in range(FAR + 10)], "max_tokens": 221},
        {"prompt_token_ids": [3 + (17 * i) % 505 for i in range(FAR + 30)], "max_tokens": 26},
    ],
    "then": [
        [{"prompt_token_ids": FAR_PREFIX + [17], "max_tokens": 23}],
        [{"prompt_token_ids": FAR_PREFIX + [40, 41], "max_tokens": 19}],
    ],
    "enable_prefix_caching": True,
}


@pytest.fixture(scope="module")
def far_pp1(models):
    res = run_job(job(models["far"], worker="stock", **FAR_CELLS))
    assert res.returncode == 0, res.log[-6000:]
    return res


# Each far line's switches beside the drafter's stage. ``one-preempted``: one
# batch in flight and a KV cache of 5 blocks, so requests are preempted and
# re-join from the first rank's cached token list; the far target reads its
# context 200 positions back, so a wrong id there changes its tokens.
FAR_LINES = {
    "pp": ({}, {}),
    "one-preempted": ({"VLLM_PPSPEC_ONE_BATCH": "1"}, {"num_kv_blocks": 5}),
}


@pytest.mark.parametrize("line", sorted(FAR_LINES))
def test_first_stage_drafter_reads_its_cache_far_back_through_chunks_and_prefix_hits(
    models, far_pp1, line
):
    """Every draft of the far copy drafter is accepted (but those a preempted
    request's recomputation drops): its cache holds every chunk of a long
    prompt and the prefix an earlier request left; the tokens are vLLM's at
    PP=1 without spec."""
    switches, engine = FAR_LINES[line]
    _, spec = tiny_spec(models, "far_copy", K)
    cells = {**FAR_CELLS, **engine}
    res = run_job(job(models["far"], pp=2, spec=spec, env={**FIRST, **switches}, **cells), 900)
    _check(res, far_pp1)  # tokens, the prefix hit, acceptance (every draft in the then lists)
    preempted = res.result["preemptions"] > 0
    assert preempted == ("num_kv_blocks" in engine), res.result["preemptions"]
    if not preempted:  # no recomputation drops a draft: every one is accepted
        stats = res.result["spec"]
        assert stats["accepted"] == stats["drafts"], stats
