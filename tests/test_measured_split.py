"""The measured layer split (``VLLM_PPSPEC_LAYER_SPLIT=measured``).

* :func:`choose_measured` against a brute force written here (every split,
  its slowest stage's time, the memory limits, the tie nearest vLLM's split);
* a slow stage gets fewer layers, one short of memory too; speeds within the
  noise margin keep the weights rule's split;
* two real gloo ranks, the second held to half a core by the cgroup v1 ``cpu``
  controller (``hosts/cpu_quota.py``): each measures (``runner/stage_speed.py``),
  they gather, the first decides, both hold the same split and log it, the
  slow one with fewer layers than the weights rule gives it; a rank whose
  measurement fails leaves both on the weights rule's split, no rank waiting;
* the rule is refused naming its values, and the start-up check compares it.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
from types import SimpleNamespace

import pytest
import torch

from tests.distributed import run_ranks
from vllm_ppspec.choice import layer_split, policy
from vllm_ppspec.choice.layer_split import StageFigures, choose_measured
from vllm_ppspec.choice.stage_work import Stages
from vllm_ppspec_tools.hosts import cpu_quota

INF = float("inf")
# SmolLM2-135M's sizes (30 layers).
SMOLLM2 = SimpleNamespace(
    hidden_size=576,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    num_hidden_layers=30,
)


def _brute(layers, stages, even, figures, bpp):
    """Every split of ``layers`` over the stages: the least slowest-stage time
    within memory, the nearest ``even`` among those."""
    pp = len(figures)
    fastest = min(f.seconds_per_param for f in figures)
    best = None
    for cut in itertools.combinations(range(1, layers), pp - 1):
        split = [b - a for a, b in zip((0, *cut), (*cut, layers), strict=True)]
        times = []
        for i, n in enumerate(split):
            work, held = n * stages.layer_work, n * stages.layer_weights
            if i == 0:
                work, held = work + stages.first_work, held + stages.first_weights
            if i == pp - 1:
                work, held = work + stages.last_work, held + stages.last_weights
            if held * bpp > figures[i].capacity_bytes:
                times = None
                break
            times.append(work * figures[i].seconds_per_param / fastest)
        if times is None:
            continue
        key = (round(max(times), 9), sum(abs(a - b) for a, b in zip(split, even, strict=True)))
        if best is None or key < best[0]:
            best = (key, split)
    return None if best is None else best[1]


def _stages(last_work=2.0, first_work=0.0):
    return Stages(
        layer_work=1.0,
        layer_weights=1.0,
        last_work=last_work,
        last_weights=1.0,
        first_weights=1.0,
        first_work=first_work,
    )


def test_the_choice_is_the_brute_forces_on_random_stages():
    rng = random.Random(7)
    for _ in range(300):
        pp = rng.choice((2, 3, 4))
        layers = rng.randint(pp, 12)
        stages = _stages(rng.choice((0.0, 0.5, 2.0, 5.0)), rng.choice((0.0, 3.0)))
        figures = [
            StageFigures(rng.choice((1.0, 1.3, 2.0, 3.0)), rng.choice((INF, INF, 6.0, 9.0)), "h")
            for _ in range(pp)
        ]
        even = layer_split.spread(layers, pp)
        want = _brute(layers, stages, even, figures, 1.0)
        assert choose_measured(layers, stages, even, figures, 1.0) == want, (
            layers,
            stages,
            figures,
        )


def test_a_half_speed_stage_gets_fewer_layers_and_memory_bounds_a_stage():
    even = [15, 15]
    stages = _stages(last_work=2.0)
    equal = [StageFigures(1.0, INF, "a"), StageFigures(1.0, INF, "b")]
    slow_last = [StageFigures(1.0, INF, "a"), StageFigures(2.0, INF, "b")]
    slow_first = [StageFigures(2.0, INF, "a"), StageFigures(1.0, INF, "b")]
    assert choose_measured(30, stages, even, equal, 1.0) == [16, 14]
    assert choose_measured(30, stages, even, slow_last, 1.0) == [21, 9]
    assert choose_measured(30, stages, even, slow_first, 1.0) == [11, 19]  # 22 each; nearer
    # The fast first stage has room for 12 layers (and its embedding) only.
    short = [StageFigures(1.0, 13.0, "a"), StageFigures(2.0, INF, "b")]
    assert choose_measured(30, stages, even, short, 1.0) == [12, 18]
    none_fits = [StageFigures(1.0, 5.0, "a"), StageFigures(2.0, 5.0, "b")]
    assert choose_measured(30, stages, even, none_fits, 1.0) is None


def test_the_rule_is_read_and_a_bad_one_refused(monkeypatch):
    from vllm_ppspec.choice.policy import split_rule

    monkeypatch.delenv(policy.SPLIT_RULE_ENV, raising=False)
    assert split_rule() == "weights"
    monkeypatch.setenv(policy.SPLIT_RULE_ENV, " Measured ")
    assert split_rule() == "measured"
    monkeypatch.setenv(policy.SPLIT_RULE_ENV, "fastest")
    with pytest.raises(
        ValueError, match="VLLM_PPSPEC_LAYER_SPLIT='fastest'.*even, weights, measured"
    ):
        split_rule()


def test_the_start_up_check_compares_the_rule(monkeypatch):
    from vllm_ppspec.choice.plan import Plan, with_switches
    from vllm_ppspec.choice.policy import Mode
    from vllm_ppspec.runner.health.startup_check import fingerprint

    runner = SimpleNamespace(
        speculative_config=SimpleNamespace(
            method="ngram", num_speculative_tokens=3, draft_model_config=None
        ),
        parallel_config=SimpleNamespace(pipeline_parallel_size=2),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
    )
    field = "layer split rule ($VLLM_PPSPEC_LAYER_SPLIT)"
    monkeypatch.setenv(policy.SPLIT_RULE_ENV, "measured")
    sync = Plan(worker=True, line=True, mode=Mode.SYNC, pp=2)
    measured = fingerprint(runner, with_switches(sync, runner))[field]
    monkeypatch.delenv(policy.SPLIT_RULE_ENV)
    weights = fingerprint(runner, with_switches(sync, runner))[field]
    assert (measured, weights) == ("measured", "weights")


def _config():
    """A stand-in VllmConfig of SmolLM2 + ngram (k = 3) at PP = 2, its plan
    settled from this process's environment (``choice/plan.py``)."""
    from vllm_ppspec.choice import plan as plans

    config = SimpleNamespace(
        model_config=SimpleNamespace(
            hf_text_config=SMOLLM2,
            dtype=torch.float32,
            get_total_num_hidden_layers=lambda: 30,
        ),
        speculative_config=SimpleNamespace(
            method="ngram", num_speculative_tokens=3, parallel_drafting=False
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=8, async_scheduling=False),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=2, data_parallel_size=1, distributed_executor_backend="mp"
        ),
        cache_config=SimpleNamespace(gpu_memory_utilization=0.9),
    )
    config.additional_config = {}
    plan = plans.Plan(worker=True, line=True, mode=plans.Mode.SYNC, pp=2)
    plans.keep(config, plans.with_switches(plan, config))
    return config


def _settle_rank(slow_group: str | None, fail: bool, rank: int, world: int):
    """One PP rank: rank 1 into ``slow_group`` (a quarter of a core), each on its own
    core. A quarter, not a half: beside the other unit tests' processes rank 0 may
    get half its core, and rank 1 must still be the slower."""
    from vllm.distributed.parallel_state import get_pp_group

    from vllm_ppspec.runner import stage_speed

    os.sched_setaffinity(0, {rank % (os.cpu_count() or 1)})
    torch.set_num_threads(1)
    if rank == 1 and slow_group is not None:
        (cpu_quota.ROOT / slow_group / "cgroup.procs").write_text(str(os.getpid()))
    if rank == 1 and fail:
        stage_speed.capacity = lambda *a: 1 / 0  # type: ignore[assignment]
    os.environ[policy.SPLIT_RULE_ENV] = "measured"
    os.environ.pop(policy.SPLIT_ENV, None)
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    layer_split.logger.addHandler(handler)
    layer_split.logger.setLevel(logging.INFO)
    assert stage_speed.applies(_config())
    value = stage_speed.settle(_config(), get_pp_group(), torch.device("cpu"))
    assert os.environ.get(policy.SPLIT_ENV) == value
    (cpu_quota.ROOT / "cgroup.procs").write_text(str(os.getpid()))  # out before the group goes
    return value, lines


@pytest.mark.skipif(not cpu_quota.available(), reason="needs the cgroup v1 cpu controller")
def test_two_ranks_measure_a_slow_rank_and_hold_one_split():
    from vllm_ppspec.choice.stage_work import estimate

    stages = estimate(_config())
    # The weights rule keeps vLLM's split (the work alone would give 19,11: more
    # weights on the first stage than the even split's heaviest).
    assert layer_split.choose(30, 2, stages, [15, 15]) == [15, 15]
    with cpu_quota.cpu_quota(0.25, "test") as group:
        rank = functools.partial(_settle_rank, group.name, False)
        results = run_ranks(rank, vllm_groups=True)
    assert [r.error for r in results] == [None, None], [r.message for r in results]
    (v0, log0), (v1, log1) = (r.value for r in results)
    same = [line.split("; measured in")[0] for line in log0]  # each rank's own seconds
    assert v0 == v1 and same == [line.split("; measured in")[0] for line in log1], (log0, log1)
    split = [int(n) for n in v0.split(",")]
    assert split[1] < 11, log0  # the slow last stage: fewer layers than at equal speed
    assert "(measured; vLLM's even split 15,15, the weights rule's 15,15)" in log0[0]
    assert "stage 1 on " in log0[0] and "free for weights" in log0[0]


def test_a_rank_that_cannot_measure_leaves_every_rank_on_the_weights_split():
    results = run_ranks(functools.partial(_settle_rank, None, True), vllm_groups=True)
    assert [r.error for r in results] == [None, None], [r.message for r in results]
    (v0, log0), (v1, _) = (r.value for r in results)
    assert v0 == v1 == "15,15"
    assert "stage 1 could not measure (ZeroDivisionError" in log0[0]


def test_memory_for_weights_on_cpu_and_cuda(monkeypatch):
    """CPU: the available memory less vLLM's KV cache space; CUDA (no GPU here:
    torch's query stood in): what gpu_memory_utilization leaves of the free
    memory; a fifth of either for the KV cache and the activations."""
    import psutil

    from vllm_ppspec.runner import stage_speed

    gib = 2**30
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=20 * gib))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert stage_speed.capacity(_config(), torch.device("cpu")) == 0.8 * 16 * gib
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * gib, 40 * gib))
    # 90% of 40 GiB usable, 10 GiB held by others: 26 GiB for vLLM.
    assert stage_speed.capacity(_config(), torch.device("cuda", 0)) == 0.8 * 26 * gib


def test_the_benchmark_is_sized_from_the_config_and_capped():
    from vllm_ppspec.runner import stage_speed

    shapes = stage_speed._matrices(SMOLLM2, 10**9)
    assert shapes == [(576, 15 * 64), (576, 576), (576, 2 * 1536), (1536, 576)]
    big = SimpleNamespace(hidden_size=8192, num_attention_heads=64, intermediate_size=28672)
    capped = stage_speed._matrices(big, stage_speed.MAX_PARAMS)
    assert sum(r * c for r, c in capped) <= stage_speed.MAX_PARAMS
    assert [r for r, _ in capped] == [8192, 8192, 8192, 28672]


def test_speeds_within_the_noise_band_count_as_equal():
    """``layer_split.SAME_SPEED``: stages measured within 10% of each other are
    taken as equal (the measurement's noise between start-ups), so equal hosts
    keep one split whichever measured faster; past the band the slower stage
    gets fewer layers."""
    from vllm_ppspec.runner.stage_speed import decide

    def split(first: float, second: float) -> list[int] | None:
        figures = [StageFigures(first, INF, "a"), StageFigures(second, INF, "b")]
        return decide(_config(), figures)[0]

    level = split(1.0, 1.0)
    assert split(1.0, 1.09) == split(1.09, 1.0) == level, level
    slower_second = split(1.0, 1.3)
    assert slower_second is not None and slower_second[1] < level[1], (level, slower_second)
    assert split(1.3, 1.0)[0] < level[0]
