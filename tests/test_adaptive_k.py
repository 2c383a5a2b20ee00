"""Adaptive K (``VLLM_PPSPEC_ADAPTIVE_K=1``): the cost and acceptance model, the
scheduler side fed a simulated pipeline, vLLM's own scheduler running the K it
sets (K = 0 included), and where it stays off.

The K expected here is computed by hand from the formula of ``k_model``
(tokens per second, ``B * (1 + accepted(K)) / cost(B, K)``, every K tried),
not by the module's own ``best_k`` or ``rates``.

The real engine's side is tests/test_e2e_methods.py::test_adaptive_k_*: the
tokens equal PP=1 without spec, the adaptive K starts once, and each schedule
it logs is in vLLM's form with K in 0..3. Which K the engine then runs, and
whether it reaches 0, depends on the timings it measures: that the plugin's
scheduler makes vLLM's scheduler run the K chosen, K = 0 included, is checked
here on a real scheduler fed a simulated runner
(``test_vllms_scheduler_runs_the_k_chosen_down_to_no_drafts``).
"""

from __future__ import annotations

import itertools
import random
import re
from types import SimpleNamespace

import pytest

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec import adaptive_k as config_adaptive_k
from vllm_ppspec.adaptive_k import chooser as adaptive_k
from vllm_ppspec.adaptive_k import k_model
from vllm_ppspec.adaptive_k.k_model import Acceptance, Cost
from vllm_ppspec.choice import policy


def test_acceptance_counts_each_position_over_the_rounds_that_reached_it():
    acc = Acceptance(3)
    acc.add(3, 3, 3)  # all three accepted
    acc.add(3, 3, 1)  # first accepted, second rejected
    acc.add(3, 1, 0)  # ngram found one draft; rejected
    acc.add(1, 1, 1)  # proposed with K = 1: counts at position 1 only
    acc.add(0, 0, 0)  # a prefill round: nothing
    assert acc.reached == [4, 3, 3]
    assert acc.drafted == [4, 2, 2]
    assert acc.accepted == [3, 1, 1]
    assert acc.accepted_per_round(3) == pytest.approx(3 / 4 + 1 / 3 + 1 / 3)
    assert acc.drafted_per_round(2) == pytest.approx(1 + 2 / 3)
    assert acc.accepted_per_round(0) == 0


def _samples(cost: Cost, sizes, noise: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    out = []
    for b, k in itertools.product(sizes, range(4)):
        for drafted in (0, k):  # ngram: some rounds find no draft
            tokens = b * (1 + drafted)
            seconds = cost.of(b, tokens, k) * (1 + noise * rng.uniform(-1, 1))
            out.append((b, tokens, k, seconds))
    return out


def test_the_fit_recovers_each_term_of_the_batch_cost():
    true = Cost(base=0.010, per_token=0.0005, per_pass=0.002, per_request=0.0008)
    got = k_model.fit_cost(_samples(true, sizes=(1, 2, 4, 8, 16)))
    for term in ("base", "per_token", "per_pass", "per_request"):
        assert getattr(got, term) == pytest.approx(getattr(true, term), rel=1e-6), term


def test_the_fit_keeps_every_term_non_negative_and_drops_outliers():
    true = Cost(base=0.010, per_token=0.0005, per_pass=0.0, per_request=0.0)
    samples = _samples(true, sizes=(8,), noise=0.02)
    # Cost that falls with K (noise a least-squares fit would follow) and one stall.
    samples = [(b, n, k, s - 0.0001 * k) for b, n, k, s in samples] + [(8, 16, 1, 5.0)]
    got = k_model.fit_cost(samples)
    assert got.per_pass == 0.0 and got.per_request == 0.0  # batch size fixed: in base
    assert got.per_token == pytest.approx(0.0005, rel=0.2)
    assert got.base == pytest.approx(0.010, abs=0.003)


def test_k_falls_as_batches_grow_where_a_token_costs_more_than_a_step():
    acc = Acceptance(3)
    for _ in range(10):  # 0, 1, 2 or 3 of 3 drafts accepted, as often each
        acc.add(3, 3, 0)
        acc.add(3, 3, 1)
        acc.add(3, 3, 2)
        acc.add(3, 3, 3)
    step_bound = Cost(base=0.030, per_token=0.0001, per_pass=0.0, per_request=0.0)
    token_bound = Cost(base=0.002, per_token=0.002, per_pass=0.0, per_request=0.0)
    assert [k_model.best_k(step_bound, acc, b) for b in (1, 8, 16)] == [3, 3, 3]
    ks = [k_model.best_k(token_bound, acc, b) for b in range(1, 65)]
    assert ks[0] >= 1 and ks[-1] == 0
    assert ks == sorted(ks, reverse=True)  # never rises with the batch


def test_with_every_draft_accepted_and_free_drafting_k_is_the_most():
    acc = Acceptance(3)
    acc.add(3, 3, 3)
    cost = Cost(base=0.01, per_token=0.001, per_pass=0.0, per_request=0.0)
    assert {k_model.best_k(cost, acc, b) for b in (1, 8, 64)} == {3}


def test_a_running_k_moves_one_step_and_only_for_a_real_gain():
    acc = Acceptance(3, reached=[8, 8, 8], drafted=[8, 8, 8], accepted=[4, 2, 1])
    token_bound = Cost(base=0.002, per_token=0.002, per_pass=0.0, per_request=0.0)
    assert k_model.best_k(token_bound, acc, 64) == 0
    assert k_model.step_toward(token_bound, acc, 64, current=3) == 2  # not 0 at once
    assert k_model.step_toward(token_bound, acc, 64, current=0) == 0
    # Flat cost: every K is as good within the margin, nothing moves.
    flat = Cost(base=1.0, per_token=0.0, per_pass=0.0, per_request=0.0)
    none_accepted = Acceptance(3, reached=[8, 8, 8], drafted=[8, 8, 8], accepted=[0, 0, 0])
    assert k_model.step_toward(flat, none_accepted, 8, current=2) == 2


def test_the_schedule_is_vllms_form_and_expands_to_the_same_lookup():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    per_size = [3, 3, 2, 2, 2, 1, 0, 0]
    ranges = k_model.schedule_ranges(per_size)
    assert ranges == [[1, 2, 3], [3, 5, 2], [6, 6, 1], [7, 8, 0]]
    assert build_dynamic_sd_schedule_lookup(ranges, 8, 3)[1:] == per_size


# The scheduler's side, fed a simulated pipeline: each batch takes
# ``true.of(requests, tokens, K)`` seconds on a fake clock; every draft is
# accepted with probability ACCEPT, position after position.
TRUE = Cost(base=0.020, per_token=0.0005, per_pass=0.0005, per_request=0.0)
ACCEPT = 0.5


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _serve(
    ak: adaptive_k.AdaptiveK, batch_sizes, clock: _Clock, seed: int = 1, true: Cost = TRUE
) -> list[int]:
    """Run one batch per entry of ``batch_sizes`` through ``ak``; the K each ran."""
    rng = random.Random(seed)
    sched = SimpleNamespace(dynamic_sd_lookup=None, requests={})
    drafts: dict[str, int] = {}
    ran = []
    for b in batch_sizes:
        ids = [f"b{b}-r{i}" for i in range(b)]
        sched.requests = dict.fromkeys(ids)
        ak.before_schedule(sched)
        k = sched.dynamic_sd_lookup[b]
        ran.append(k)
        out = SimpleNamespace(
            num_scheduled_tokens={r: 1 + drafts.get(r, 0) for r in ids},
            scheduled_spec_decode_tokens={r: [-1] * drafts.get(r, 0) for r in ids},
            num_spec_tokens_to_schedule=k,
        )
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        ak.scheduled(out)
        clock.now += true.of(b, out.total_num_scheduled_tokens, k)
        sampled = []
        for r in ids:
            accepted = next(
                (i for i in range(drafts.get(r, 0)) if rng.random() >= ACCEPT), drafts.get(r, 0)
            )
            sampled.append([7] * (1 + accepted))
            drafts[r] = k
        runner = SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)  # fmt: skip
        ak.after_output(sched, out, runner)
    return ran


def _tokens_per_second(true: Cost, b: int, k: int) -> float:
    """By hand, for the simulated pipeline: a batch of ``b`` requests proposed
    with ``k`` drafts each runs ``b * (1 + k)`` tokens and takes
    ``base + per_token * tokens + per_pass * k + per_request * b`` seconds; a
    request's ``i``-th draft is accepted with probability ``ACCEPT ** i``
    (every earlier one accepted too), so it gains ``sum(ACCEPT ** i)`` tokens."""
    gained = sum(ACCEPT**i for i in range(1, k + 1))
    seconds = true.base + true.per_token * b * (1 + k) + true.per_pass * k + true.per_request * b
    return b * (1 + gained) / seconds


def _expected(max_batch: int, true: Cost = TRUE, k: int = 3) -> list[int]:
    """For each batch size 1..max_batch, the K in 0..k with the most tokens per
    second (brute force over K; a tie to the smaller K)."""
    return [
        max(range(k + 1), key=lambda kk: (_tokens_per_second(true, b, kk), -kk))
        for b in range(1, max_batch + 1)
    ]


def test_the_expected_schedule_is_the_formulas():
    """The brute force above, checked at the switches by hand: at B = 3,
    K = 2 gives 3 * 1.75 / 0.0255 = 205.9 tokens/s, K = 3 3 * 1.875 / 0.0275 =
    204.5; at B = 9, K = 1 gives 13.5 / 0.0295 = 457.6, K = 2 15.75 / 0.0345 = 456.5."""
    assert _tokens_per_second(TRUE, 3, 2) == pytest.approx(3 * 1.75 / 0.0255)
    assert _tokens_per_second(TRUE, 9, 1) == pytest.approx(13.5 / 0.0295)
    assert _expected(32) == [3, 3] + [2] * 6 + [1] * 24


def test_the_scheduler_chooses_the_schedule_the_measured_pipeline_calls_for(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(adaptive_k.time, "perf_counter", clock)
    ak = adaptive_k.AdaptiveK(k=3, max_batch=32, batches=200)
    sizes = [1, 2, 4, 8, 16, 32] * 80
    ran = _serve(ak, sizes, clock)
    want = _expected(32)
    assert want[0] == 3 and want[-1] < 3  # the case has K that follows the load
    got = ak.lookups[0][1:]
    assert got[0] == want[0] and got[-1] == want[-1]
    # Elsewhere K stays only where the step toward the best K gains at most the
    # 2% the chooser promises (adaptive_k/chooser.py; sizes near a switch may stay).
    assert k_model.MARGIN == 0.02
    for size, k in enumerate(got, start=1):
        step = k + (want[size - 1] > k) - (want[size - 1] < k)
        gain = _tokens_per_second(TRUE, size, step) / _tokens_per_second(TRUE, size, k)
        assert gain <= 1.02, (size, k, want[size - 1], gain)
    # Before the first choice the static K ran, and K - 1 in about one batch
    # in twenty (K + 1 is K there); K then moved a step per choice (every 50
    # batches); once there, about one batch in ten ran one off the schedule.
    assert set(ran[:200]) == {2, 3} and 0.01 < ran[:200].count(2) / 200 < 0.12
    off = sum(k != got[b - 1] for k, b in zip(ran[360:], sizes[360:], strict=True))
    assert 0.03 < off / len(ran[360:]) < 0.2


def test_a_new_load_changes_the_schedule_within_a_window(monkeypatch):
    # A request costs as much as a token: at one batch size that cost is in
    # the fit's base, so the first schedule, measured at 16 requests a batch,
    # overrates the base of a batch of one. Once the load falls, the windows
    # of small batches correct it.
    true = Cost(base=0.002, per_token=0.002, per_pass=0.0, per_request=0.002)
    clock = _Clock()
    monkeypatch.setattr(adaptive_k.time, "perf_counter", clock)
    said: list[str] = []
    monkeypatch.setattr(adaptive_k.logger, "info", lambda msg, *a: said.append(msg % a))
    ak = adaptive_k.AdaptiveK(k=3, max_batch=16, batches=100)
    _serve(ak, [16] * 140, clock, true=true)
    assert ak.lookups is not None and ak.lookups[0][1] >= 2  # the best is 1
    _serve(ak, [1, 2] * 100, clock, seed=2, true=true)
    assert ak.lookups[0][1:3] == _expected(16, true)[:2] == [1, 1]
    assert ak.schedule is not None and ak.schedule[0][:1] + ak.schedule[0][2:] == [1, 1]
    # Logged: the first schedule, and the last change for the sizes run: K = 1
    # from a batch of one request (the range's end depends on the fit).
    assert len(said) >= 2 and "num_speculative_tokens_per_batch_size=[[1, " in said[0]
    assert re.search(r"num_speculative_tokens_per_batch_size=\[\[1, \d+, 1\]", said[-1]), said[-1]


def _spec(**extra):
    return SimpleNamespace(num_speculative_tokens_per_batch_size=None, num_speculative_tokens=3,
                           **extra)  # fmt: skip


def _sched(spec, dp: int = 1):
    """A plugin scheduler's stand-in on a sync PP = 2 line, its plan settled from
    this process's environment (choice/plan.py)."""
    from vllm_ppspec.choice import plan as plans

    config = SimpleNamespace(
        speculative_config=spec,
        parallel_config=SimpleNamespace(data_parallel_size=dp),
        additional_config={},
    )
    plan = plans.Plan(worker=True, line=True, mode=plans.Mode.SYNC, pp=2)
    plans.keep(config, plans.with_switches(plan, config))
    return SimpleNamespace(
        num_spec_tokens=3, vllm_config=config, scheduler_config=SimpleNamespace(max_num_seqs=8)
    )


def test_the_stand_in_is_set_only_on_the_plugins_lines_without_a_users_schedule(monkeypatch):
    monkeypatch.setenv(policy.ADAPTIVE_K_ENV, "1")
    cfg = SimpleNamespace(speculative_config=_spec())
    assert config_adaptive_k.stand_in(cfg, plugin_acts=True)
    assert cfg.speculative_config.num_speculative_tokens_per_batch_size == [(1, 1, 3)]
    off = SimpleNamespace(speculative_config=_spec())
    assert not config_adaptive_k.stand_in(off, plugin_acts=False)
    assert off.speculative_config.num_speculative_tokens_per_batch_size is None
    users = SimpleNamespace(speculative_config=_spec())
    users.speculative_config.num_speculative_tokens_per_batch_size = [(1, 4, 2), (5, 8, 1)]
    assert not config_adaptive_k.stand_in(users, plugin_acts=True)
    assert users.speculative_config.num_speculative_tokens_per_batch_size == [(1, 4, 2), (5, 8, 1)]
    monkeypatch.delenv(policy.ADAPTIVE_K_ENV)
    unset = SimpleNamespace(speculative_config=_spec())
    assert not config_adaptive_k.stand_in(unset, plugin_acts=True)
    assert unset.speculative_config.num_speculative_tokens_per_batch_size is None


@pytest.mark.parametrize(
    "case,why",
    [
        ("user", "num_speculative_tokens_per_batch_size, which wins"),
        ("dp", "data parallelism"),
        ("unmarked", "config patch did not see this line"),
    ],
)
def test_where_it_stays_off_the_scheduler_says_why(monkeypatch, case, why):
    monkeypatch.setenv(policy.ADAPTIVE_K_ENV, "1")
    said: list[str] = []
    monkeypatch.setattr(adaptive_k.logger, "warning", lambda msg, *a: said.append(msg % a))
    spec = _spec(**{adaptive_k.STAND_IN_FLAG: case == "dp"})
    if case == "user":
        spec.num_speculative_tokens_per_batch_size = [(1, 8, 2)]
    assert adaptive_k.start(_sched(spec, dp=2 if case == "dp" else 1)) is None
    assert len(said) == 1 and why in said[0] and "K stays 3" in said[0]


def test_it_starts_on_a_marked_line_and_refuses_a_bad_window(monkeypatch):
    monkeypatch.setenv(policy.ADAPTIVE_K_ENV, "1")
    spec = _spec(**{adaptive_k.STAND_IN_FLAG: True})
    spec.num_speculative_tokens_per_batch_size = [(1, 1, 3)]
    ak = adaptive_k.start(_sched(spec))
    assert ak is not None and (ak.k, ak.max_batch, ak.window) == (3, 8, adaptive_k.DEFAULT_BATCHES)
    monkeypatch.setenv(adaptive_k.BATCHES_ENV, "0")
    with pytest.raises(ValueError, match=adaptive_k.BATCHES_ENV):
        adaptive_k.start(_sched(spec))
    monkeypatch.delenv(policy.ADAPTIVE_K_ENV)
    assert adaptive_k.start(_sched(spec)) is None


# Real configs (EngineArgs), as a user's line builds them.
def _config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model, dtype="float32", max_model_len=256, **kwargs
    ).create_engine_config()


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_on_the_plugins_line_vllm_sees_dynamic_k_and_captures_cuda_graphs_piecewise(
    models, monkeypatch
):
    """The V1 runner on CUDA: vLLM turns full CUDA graphs off for dynamic K
    (the verify length changes); the stand-in makes it do so for adaptive K."""
    from vllm.config import CUDAGraphMode

    monkeypatch.setenv(policy.ADAPTIVE_K_ENV, "1")
    cfg = _config(models["target"], pipeline_parallel_size=2, speculative_config=NGRAM)
    assert cfg.parallel_config.worker_cls == WORKER_QUALNAME
    spec = cfg.speculative_config
    assert spec.uses_dynamic_speculative_decoding()
    assert getattr(spec, adaptive_k.STAND_IN_FLAG)
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cfg._maybe_override_dynamic_sd_cudagraph_mode()
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    # Off the plugin's lines (PP = 1, or vLLM's own worker) nothing changes.
    pp1 = _config(models["target"], speculative_config=NGRAM)
    assert not pp1.speculative_config.uses_dynamic_speculative_decoding()
    stock = _config(
        models["target"], pipeline_parallel_size=2, speculative_config=NGRAM,
        worker_cls="vllm.v1.worker.cpu_worker.CPUWorker",
    )  # fmt: skip
    assert not stock.speculative_config.uses_dynamic_speculative_decoding()


def test_with_data_parallelism_vllm_drops_the_stand_in_and_the_scheduler_says_so(
    models, monkeypatch
):
    monkeypatch.setenv(policy.ADAPTIVE_K_ENV, "1")
    cfg = _config(
        models["target"], pipeline_parallel_size=2, data_parallel_size=2, speculative_config=NGRAM
    )
    spec = cfg.speculative_config
    assert getattr(spec, adaptive_k.STAND_IN_FLAG)
    assert spec.num_speculative_tokens_per_batch_size is None
    said: list[str] = []
    monkeypatch.setattr(adaptive_k.logger, "warning", lambda msg, *a: said.append(msg % a))
    sched = SimpleNamespace(
        num_spec_tokens=3, vllm_config=cfg, scheduler_config=cfg.scheduler_config
    )
    assert adaptive_k.start(sched) is None
    assert "data parallelism" in said[0]


def test_vllms_scheduler_runs_the_k_chosen_down_to_no_drafts(models, monkeypatch):
    """K = 0 reached and run: the plugin's sync scheduler (a real vLLM
    ``Scheduler`` underneath, built from the config of a user's line) fed by a
    simulated runner whose drafts are never accepted, on a pipeline where each
    draft costs time. The adaptive K steps 3, 2, 1, 0 for the batch size run,
    logs the schedule, and vLLM's scheduler then asks for no drafts
    (``num_spec_tokens_to_schedule``, what the runner reads) and schedules none;
    about one batch in twenty still runs K = 1 (exploring K + 1)."""
    from collections import deque

    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_ppspec.sched.draft_delivery import attach_drafts
    from vllm_ppspec.sched.filled import PPSpecScheduler

    monkeypatch.setenv(policy.ADAPTIVE_K_ENV, "1")
    monkeypatch.setenv(adaptive_k.BATCHES_ENV, "8")
    clock = _Clock()
    monkeypatch.setattr(adaptive_k.time, "perf_counter", clock)
    said: list[str] = []
    monkeypatch.setattr(adaptive_k.logger, "info", lambda msg, *a, **_: said.append(msg % a))
    cfg = _config(
        models["target"], pipeline_parallel_size=2, speculative_config=NGRAM, max_num_seqs=4,
        enable_prefix_caching=False,
    )  # fmt: skip
    assert cfg.scheduler_config.get_scheduler_cls() is PPSpecScheduler
    cfg.cache_config.num_gpu_blocks = 64
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float32)
    sched = PPSpecScheduler(
        vllm_config=cfg,
        kv_cache_config=KVCacheConfig(64, [], [KVCacheGroupSpec(["layer"], spec)]),
        structured_output_manager=StructuredOutputManager(cfg),
        block_size=16,
    )
    assert sched.ppspec_adaptive_k is not None and sched.ppspec_depth == 2
    for i in range(4):
        params = SamplingParams(max_tokens=200, ignore_eos=True)
        sched.add_request(Request(f"r{i}", [5, 6, 7, 8], params, None))
    # Two batches in flight (PP = 2, sync): each takes half of the requests.
    cost = Cost(base=0.010, per_token=0.002, per_pass=0.002, per_request=0.0)
    in_flight: deque = deque([sched.schedule()])
    ran: list[tuple[int, int, int]] = []  # (requests, tokens, K) of each batch
    for _ in range(120):
        in_flight.append(sched.schedule())
        out = in_flight.popleft()
        ids = list(out.num_scheduled_tokens)
        k = out.num_spec_tokens_to_schedule
        ran.append((len(ids), out.total_num_scheduled_tokens, k))
        clock.now += cost.of(len(ids), out.total_num_scheduled_tokens, k)
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[9] for _ in ids],  # every draft rejected
        )
        attach_drafts(runner, DraftTokenIds(ids, [[9] * k for _ in ids]))
        sched.update_from_output(out, runner)
    decode = ran[4:]
    assert {b for b, _, _ in decode} == {2}, ran
    assert sched.ppspec_adaptive_k.lookups[0][2] == 0
    assert any("num_speculative_tokens_per_batch_size=[[1, 4, 0]]" in s for s in said), said
    # The K vLLM asked the runner for fell 3, 2, 1, 0 in that order ...
    ks = [k for _, _, k in decode]
    first = {k: ks.index(k) for k in (3, 2, 1, 0)}
    assert first[3] < first[2] < first[1] < first[0], ks
    # ... and after it reached 0, mostly 0 (one batch in ten explores K - 1 = 0
    # or K + 1 = 1).
    after = decode[first[0] :]
    assert set(ks[first[0] :]) == {0, 1} and 0.01 < ks[first[0] :].count(1) / len(after) < 0.2
    # The next batch of the same requests (two batches on: the other half's
    # batch was scheduled before this one's output) holds the drafts the
    # runner proposed with that K: K per request, none after K = 0.
    for (_, _, k), (b, tokens, _) in zip(after[:-2], after[2:], strict=True):
        assert tokens == b * (1 + k), after
