"""End to end: real vLLM engines, PP + speculative decoding, greedy token ids.

Correctness oracle: for greedy decoding, PP + speculative decoding must give
exactly the token ids of the same model at PP=1 without speculative decoding
(stock vLLM worker), for every request. The request set mixes prompt lengths,
requests finishing at different steps (several in flight), max_tokens ending
inside a speculative round, and a prompt longer than the 64-token budget
(chunked prefill). Acceptance counts prove which kind of round ran: a copy of
the target accepts every draft, an independent random drafter rejects them.

Every method runs where vLLM runs its drafter, the last stage: the draft
models are pinned there (:data:`LAST`), as the split, the drafter's own
embedding and the counters equal to PP=1's are checked on that placement;
the default (``auto``) moves the random and the narrow drafter to the first
stage, whose cases are tests/test_e2e_drafter_first*.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance import check_acceptance
from tests.engine_jobs import GREEDY_REQUESTS, SAMPLED_REQUESTS, job, run_job
from vllm_ppspec_tools.fixtures.probes import checkpoint_embedding_digest
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

pytestmark = pytest.mark.e2e

K = 3
LAST = {"VLLM_PPSPEC_DRAFTER_STAGE": "last"}


@pytest.fixture(scope="module")
def baseline(pp1_greedy):
    """PP=1, no speculative decoding, vLLM's own worker: the oracle (tests/references.py)."""
    return pp1_greedy


CASES = [
    (method, mode)
    for method in ("ngram", "draft_copy", "draft_random", "eagle3", "eagle3_aux", "eagle", "mtp")
    for mode in ("sync", "async")
    if not (method == "ngram" and mode == "async")
]
# The mode each case's runner logs (vllm_ppspec.choice.policy.Mode).
# The target layers each PP rank holds (vllm_ppspec/choice/layer_split.py). A tiny
# model drafter on the last stage is estimated at 5-14 target layers' work
# there, so the plugin moves one of the tiny target's 4 layers to the first
# stage; ngram has no model, and vLLM's even split stays.
BALANCED = [[0, 3], [3, 4]]
TARGET_LAYERS = {"ngram": [[0, 2], [2, 4]]}
MODE_LOGGED = {"sync": "sync", "async": "async with lanes"}


def _check_drafter_embedding_is_its_own(res, checkpoint: str) -> None:
    """A draft model keeps its checkpoint's embedding (vLLM never shares it)."""
    digests = res.result["probes"]["drafter_embedding_digest"]
    assert digests[:-1] == [None] * (len(digests) - 1), digests  # no drafter there
    assert digests[-1] == checkpoint_embedding_digest(checkpoint), digests


def _check_drafter_layers(res, method: str) -> None:
    """The drafter on the last rank numbers its layers after the target's total
    layer count (4), not the last PP stage's share of it (seed 004).

    vLLM 0.32's EAGLE-3 head takes ``get_total_num_hidden_layers()`` and stores it
    as ``target_layer_count`` (its layers are ``model.layers.{count + i}``); the
    EAGLE head takes ``get_num_layers(parallel_config)``, which is the total only
    because the plugin builds the drafter with a single-stage parallel config
    (``drafter.scope._single_stage_config``). With the shard count, the PP=2
    stage's drafter layer would be ``model.layers.2`` (a clash with the target's
    layer on that rank) and the PP=3 (2|1|1) one ``model.layers.1`` (no clash:
    only this probe sees it).
    """
    from vllm_ppspec_tools.fixtures.tiny_models import NUM_LAYERS

    layers = res.result["probes"]["drafter_layers"]
    assert layers[:-1] == [None] * (len(layers) - 1), layers  # no drafter there
    assert layers[-1]["attention_layers"] == [f"model.layers.{NUM_LAYERS}.self_attn.attn"], layers
    if method.startswith("eagle3"):
        assert layers[-1]["target_layer_count"] == NUM_LAYERS, layers


# The sampled-beside-greedy cases run on the eagle3 engines of CASES, after
# their greedy requests (one start-up each instead of two).
THEN = {"eagle3": [GREEDY_REQUESTS + SAMPLED_REQUESTS]}


@pytest.fixture(scope="module")
def pp1_spec_run(models):
    """vLLM's own worker at PP=1 with spec, per method (cached)."""
    cache: dict[str, dict] = {}

    def get(method: str) -> dict:
        if method not in cache:
            target, spec = tiny_spec(models, method, K)
            res = run_job(job(models[target], spec=spec, worker="stock", probe_remote_reads=True))
            assert res.returncode == 0, res.log[-6000:]
            cache[method] = res.result
        return cache[method]

    return get


@pytest.fixture(scope="module")
def pp1_spec_metrics(pp1_spec_run):
    """The counters of ``pp1_spec_run`` over its greedy requests, per method."""
    return lambda method: pp1_spec_run(method)["spec"]


@pytest.fixture(scope="module")
def pp2_run(models):
    """The PP=2 + spec engine job of each CASES entry, run once (cached), with
    the CPU shared-memory names its engine left in /dev/shm (``.shm_left``)."""
    cache: dict[tuple[str, str], object] = {}

    def get(method: str, mode: str):
        if (method, mode) not in cache:
            target, spec = tiny_spec(models, method, K)
            before = _engine_shm_names()
            cache[method, mode] = res = run_job(
                job(
                    models[target],
                    pp=2,
                    spec=spec,
                    async_scheduling=mode.startswith("async"),
                    probe_drafter_embedding=method.startswith("draft_"),
                    probe_drafter_layers=method.startswith("eagle"),
                    env=LAST,
                    probe_target_layers=True,
                    then=THEN.get(method, []),
                )
            )
            res.shm_left = sorted(_engine_shm_names() - before)  # type: ignore[attr-defined]
        return cache[method, mode]

    return get


def _engine_shm_names() -> set[str]:
    """vLLM's CPU SHM segment names in /dev/shm, but the rank harness's own
    (tests/distributed.py, which the unit tests may create meanwhile)."""
    return {
        p.name for p in Path("/dev/shm").glob("*-cpushm_*") if not p.name.startswith("ppspec-test-")
    }


@pytest.mark.parametrize("method,mode", CASES)
def test_pp2_spec_matches_pp1_without_spec(
    models, baseline, pp1_spec_metrics, pp2_run, method, mode
):
    target, spec = tiny_spec(models, method, K)
    probe = method.startswith("draft_")
    eagle = method.startswith("eagle")
    res = pp2_run(method, mode)
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == baseline[target]
    # The stopped engine left no shared-memory name (patches/worker/cpu_shm_names.py).
    assert res.shm_left == [], res.shm_left
    said = f"speculative method {spec['method']}, k={K}, {MODE_LOGGED[mode]} scheduling"
    assert res.log.count(said) == 2, f"expected both PP ranks to log {said!r}"
    # Each rank logs the target's layer split it uses (layer_split.apply).
    assert res.log.count("vllm-ppspec: target layers split") == 2, res.log[-8000:]
    check_acceptance(method, res.result["spec"])
    assert res.result["probes"]["target_layers"] == TARGET_LAYERS.get(method, BALANCED), (
        "the plugin's layer split (vllm_ppspec/choice/layer_split.py)"
    )
    if probe:
        _check_drafter_embedding_is_its_own(res, spec["model"])
    if eagle:
        _check_drafter_layers(res, method)
    got = res.result["spec"]
    assert got["accepted"] <= got["drafts"] and sum(got["per_position"]) == got["accepted"]
    if method in ("eagle3", "draft_random", "mtp"):
        # vLLM's spec-decode counters (drafts, accepted, per position) under PP
        # equal those of vLLM's own worker at PP=1 with spec.
        want = pp1_spec_metrics(method)
        if mode == "async":
            _allow_padded_first_steps(got, want)
        assert got == want, (got, want)


def _allow_padded_first_steps(got: dict, want: dict) -> None:
    """Async lanes compose batches unlike PP=1: allow vLLM's padded first steps.

    The lane scheduler admits each step's share of the waiting requests, so a
    new request may open a batch without a prefill before it. vLLM then pads
    a request whose first step computes one token (a one-token prompt) with k
    ``-1`` drafts, for uniform spec decoding (``Scheduler.schedule``,
    ``pad_spec_decode``): one more step of k drafts, none accepted. Acceptance
    must still match exactly; the extra steps are removed from ``got``.
    """
    extra = got["steps"] - want["steps"]
    one_token = sum(len(r["prompt_token_ids"]) == 1 for r in GREEDY_REQUESTS)
    assert 0 <= extra <= one_token, (got, want)
    assert got["drafts"] - want["drafts"] == K * extra, (got, want)
    got["steps"] -= extra
    got["drafts"] -= K * extra


# Draft models of another width and depth than the target (hidden 128, 4
# layers): each width at PP=2 and PP=3, each scheduling mode at both sizes.
WIDTH_CASES = [
    ("draft_narrow", 2, "sync"),
    ("draft_narrow", 3, "async"),
    ("draft_wide", 2, "async"),
    ("draft_wide", 3, "sync"),
]


@pytest.mark.parametrize("drafter,pp,mode", WIDTH_CASES)
def test_draft_model_of_another_width_matches_pp1_without_spec(models, baseline, drafter, pp, mode):
    spec = {"method": "draft_model", "model": models[drafter], "num_speculative_tokens": K}
    res = run_job(
        job(
            models["target"],
            pp=pp,
            spec=spec,
            async_scheduling=(mode == "async"),
            probe_drafter_embedding=True,
            env=LAST,
        )
    )
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == baseline["target"]
    check_acceptance("draft_random", res.result["spec"])  # random weights: mostly rejected
    _check_drafter_embedding_is_its_own(res, models[drafter])


@pytest.mark.parametrize(
    "method,mode", [("draft_copy", "async"), ("eagle3_aux", "sync"), ("eagle3_aux", "async")]
)
def test_pp3_spec_matches_pp1_without_spec(models, baseline, method, mode):
    """PP=3: a middle stage. For EAGLE-3 the 4 target layers split 2 | 1 | 1, so
    each stage captures one auxiliary hidden state (aux layers 1, 2, 3) and the
    middle stage relays the first stage's to the last (where the drafter is).
    ``eagle3_aux`` reads its first draft from that state only: a lost or wrong
    relay collapses its acceptance (about 1% instead of the planted rule's).
    Every case sets the 2 | 1 | 1 split with VLLM_PP_LAYER_PARTITION, which
    the one-stage drafter build must not see (a draft model raised before)."""
    target, spec = tiny_spec(models, method, K)
    eagle3 = method.startswith("eagle3")
    # The draft model is built as one stage while this partition lays out the
    # target's three (drafter.scope.target_partition_hidden).
    env = {"VLLM_PP_LAYER_PARTITION": "2,1,1"}
    res = run_job(
        job(
            models[target],
            pp=3,
            spec=spec,
            async_scheduling=(mode == "async"),
            env=env,
            probe_drafter_layers=eagle3,
        )
    )
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == baseline[target]
    said = f"speculative method {spec['method']}, k={K}, {MODE_LOGGED[mode]} scheduling"
    assert res.log.count(said) == 3, f"expected all 3 PP ranks to log {said!r}"
    check_acceptance(method, res.result["spec"])
    if eagle3:
        # The last stage holds 1 of the 4 layers: its drafter is still numbered
        # after all 4.
        _check_drafter_layers(res, method)


# Seeded sampled requests on the MoE target. The tiny dense targets sample
# their greedy token at any temperature vLLM accepts (at most 2.0; their
# top-1/top-2 logit gaps are 16-100), so a seed changes nothing there. The
# MoE target's random experts leave entropy: at 2.0 its top-1 token has 0.82-
# 0.87 of the mass on average. Each sampled prompt is also sent greedily.
MOE_SAMPLED: list[dict] = [
    {"prompt_token_ids": [12, 13, 14], "max_tokens": 25, "temperature": 2.0, "seed": 11},
    {"prompt_token_ids": [200, 201], "max_tokens": 19, "temperature": 2.0, "seed": 12},
    {
        "prompt_token_ids": [7, 8],
        "max_tokens": 17,
        "temperature": 2.0,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 13,
    },
]
MOE_GREEDY = [
    {"prompt_token_ids": r["prompt_token_ids"], "max_tokens": r["max_tokens"]} for r in MOE_SAMPLED
]


@pytest.fixture(scope="module")
def moe_sampled(models):
    """``draft_moe`` on the MoE target: the greedy and the seeded sampled
    requests together, at PP=1 or at PP=2 (then the sampled ones alone, a
    second run on the same engine), with the plugin's worker. Cached.

    At PP=1 the plugin's runner stays out (policy.Mode.OFF): vLLM's own
    sampling, with the CPU worker's fix of vLLM's expand fallback
    (patches/worker/cpu_expand.py). vLLM's own worker cannot be the reference here:
    its CPU rejection sampler reads unwritten top-k values (measured: PP=1 +
    draft_model with these requests, "index 1877009520 is out of bounds for
    dimension 1 with size 512" in apply_top_k_top_p). PP=1 runs sync: with
    async scheduling the plugin's worker at PP=1 drafted nothing (0 drafts,
    while vLLM's own worker drafts 114 of the greedy requests' 114; measured
    2026-12-02), so its tokens were those of no speculation at all."""
    cache: dict[str, dict] = {}

    def get(mode: str) -> dict:
        if mode not in cache:
            target, spec = tiny_spec(models, "draft_moe", K)
            pp1 = mode == "pp1"
            res = run_job(
                job(
                    models[target],
                    pp=1 if pp1 else 2,
                    spec=spec,
                    async_scheduling=not pp1 and mode == "async",
                    requests=MOE_GREEDY + MOE_SAMPLED,
                    then=[] if pp1 else [MOE_SAMPLED],
                )
            )
            assert res.returncode == 0, res.log[-6000:]
            cache[mode] = res.result
        return cache[mode]

    return get


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_greedy_tokens_unchanged_beside_sampled_requests(
    models, baseline, pp2_run, moe_sampled, mode
):
    """Greedy and sampled (temperature 1.0 / 0.8 with top-p and top-k) requests
    in the same speculative batches: the greedy ones keep PP=1's tokens.

    Before cpu_expand_fix, vLLM 0.32's CPU rejection sampler divided every
    row's logits, greedy rows included, by leftover memory whenever a batch held
    a sampled request (measured with vLLM's own worker at PP=1 too). Runs on
    the eagle3 engine of ``test_pp2_spec_matches_pp1_without_spec``, after its
    greedy requests.

    Seeded sampled requests are reproducible (``moe_sampled``, where sampling
    leaves the greedy tokens): the sampler and the rejection sampler run once,
    on the last rank, with each request's own seeded generator, so a request's
    tokens at PP=2 + spec are the same in a later batch of the same engine and
    the same as at PP=1 with the same speculative config (vLLM's sampling).
    """
    res = pp2_run("eagle3", mode)
    assert res.returncode == 0, res.log[-8000:]
    beside = res.result["then"][0]
    assert beside["outputs"][: len(GREEDY_REQUESTS)] == baseline["target"]
    # The dense target samples its greedy token at any temperature (above
    # MOE_SAMPLED): the sampled requests give the tokens of PP=1 without spec,
    # i.e. the planted rule (tests/references.py pins PP=1 to it).
    from vllm_ppspec_tools.fixtures.tiny_models import greedy_reference

    for req, out in zip(SAMPLED_REQUESTS, beside["outputs"][len(GREEDY_REQUESTS) :], strict=True):
        assert out == greedy_reference(req["prompt_token_ids"], req["max_tokens"]), req
    assert beside["spec"]["drafts"] > 0

    pp1, pp2 = moe_sampled("pp1"), moe_sampled(mode)
    n = len(MOE_GREEDY)
    greedy, sampled = pp2["outputs"][:n], pp2["outputs"][n:]
    assert greedy == pp1["outputs"][:n]  # greedy beside sampled, MoE target
    for out, want in zip(sampled, greedy, strict=True):
        assert out != want, "a sampled request gave the greedy tokens: nothing was sampled"
    assert pp2["then"][0]["outputs"] == sampled, "same seeds, a later batch: other tokens"
    assert sampled == pp1["outputs"][n:], "same seeds, PP=1 with spec: other tokens"
    assert pp2["spec"]["drafts"] > 0


def test_ngram_with_async_scheduling_is_refused_clearly(models):
    target, spec = tiny_spec(models, "ngram", K)
    res = run_job(job(models[target], pp=2, spec=spec, async_scheduling=True), timeout=300)
    assert res.returncode != 0
    from tests.test_config_patches import async_refusal

    assert async_refusal("ngram") in res.log


def test_stock_worker_still_fails_with_pp_and_spec(models):
    """Upstream vLLM 0.32 cannot run PP + spec; this tells us when that changes."""
    target, spec = tiny_spec(models, "draft_copy", K)
    res = run_job(job(models[target], pp=2, spec=spec, worker="stock"), timeout=300)
    assert res.returncode != 0
    assert "has no attribute 'drafter'" in res.log


def test_pp2_spec_without_worker_cls_selects_the_plugin_and_matches_pp1(
    models, baseline, pp1_spec_run
):
    """No ``worker_cls`` at all (vLLM's ``auto``): the plugin's hook selects its
    worker, says so once, and the tokens are PP=1's. The engine core running
    the plugin's scheduler (here the job's process) installed the cancellable
    remote read (patches/engine_core/remote_reads.py: ``install()`` from its post_step);
    one running vLLM's own scheduler (PP=1, vLLM's worker) left vLLM's alone."""
    from vllm_ppspec.patches.config.selection import AUTO_NOTICE

    target, spec = tiny_spec(models, "draft_copy", K)
    res = run_job(job(models[target], pp=2, spec=spec, worker="auto", probe_remote_reads=True))
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == baseline[target]
    assert AUTO_NOTICE in res.log
    assert res.log.count(f"speculative method draft_model, k={K}, sync scheduling") == 2
    check_acceptance("draft_copy", res.result["spec"])
    assert res.result["probes"]["remote_reads"] is True, "remote_reads.install() not reached"
    assert pp1_spec_run("mtp")["probes"]["remote_reads"] is False


def test_pp2_compile_mode_with_warmup_dummy_runs(models, baseline):
    """Compile mode: vLLM's warm-up runs _dummy_run on every rank (the drafter's
    dummy run on the last rank only), which the eager CPU path skips."""
    target, spec = tiny_spec(models, "draft_random", K)
    res = run_job(job(models[target], pp=2, spec=spec, enforce_eager=False))
    assert res.returncode == 0, res.log[-8000:]
    assert res.outputs == baseline[target]
    check_acceptance("draft_random", res.result["spec"])
