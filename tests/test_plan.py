"""One plan per engine configuration (``choice/plan.py``), settled once and read by every place.

Real ``VllmConfig`` objects through ``EngineArgs`` on a tiny local model (no
engine started): the plan settled at the end of ``__post_init__`` says who
serves, the mode, the batches in flight, the scheduler, whether the ranks
check the deployment and watch each other, and what vLLM's config reports
(``max_concurrent_batches``, the scheduler class) is what the plan says. The
plan travels with the config to the workers (pickled) and through vLLM's
``config.utils.replace`` (which keeps only fields: the drafter's config is made
with it), and a config that changes after it was settled keeps its plan:
nothing decides twice. Where no rank can act the config is vLLM's.
"""

from __future__ import annotations

import pickle

import pytest

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.choice.plan import PLAN_KEY, Plan, decide, plan_of
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.plugin import register

register()


def _config(models, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=models["target"], dtype="float32", max_model_len=256, **kwargs
    ).create_engine_config()


def _spec(models):
    return {"method": "draft_model", "model": models["draft_copy"], "num_speculative_tokens": 3}


@pytest.fixture(autouse=True)
def _automatic(monkeypatch):
    monkeypatch.delenv("VLLM_PPSPEC_AUTO", raising=False)


def test_pp_spec_settles_the_plugins_plan_and_vllm_reads_it(models):
    cfg = _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
    assert cfg.additional_config[PLAN_KEY] == {
        "worker": True,
        "line": True,
        "mode": "SYNC",
        "pp": 2,
        "one_batch": False,
        "drafter_first": False,
        # The default, auto: the tiny copy drafter leaves the stages as they are.
        "drafter_why": "auto: on the first stage the busiest stage reads 0.97x the weights "
        "it reads with the drafter last (it moves below 0.95x)",
        "split_rule": "weights",
        "adaptive_k": False,
    }
    plan = plan_of(cfg)
    assert plan == Plan(
        worker=True,
        line=True,
        mode=Mode.SYNC,
        pp=2,
        drafter_why=cfg.additional_config[PLAN_KEY]["drafter_why"],
    )
    assert plan.acts and plan.serves_pp and plan.checks_deployment and plan.watches_peers
    assert cfg.parallel_config.worker_cls == WORKER_QUALNAME
    assert cfg.max_concurrent_batches == plan.batches_in_flight == 2
    assert cfg.scheduler_config.scheduler_cls == plan.scheduler
    assert plan.scheduler == "vllm_ppspec.sched.filled.PPSpecScheduler"


@pytest.mark.parametrize(
    "shape",
    [
        {"tensor_parallel_size": 2},  # TP=2, no spec
        {"tensor_parallel_size": 2, "spec": True},  # TP=2 + spec: PP = 1, DP = 1
        {"pipeline_parallel_size": 2},  # PP=2, no spec
    ],
    ids=["tp2", "tp2-spec", "pp2-no-spec"],
)
def test_where_no_rank_can_act_the_plan_checks_and_watches_nothing(models, shape):
    shape = dict(shape)
    spec = _spec(models) if shape.pop("spec", False) else None
    cfg = _config(models, speculative_config=spec, **shape)
    plan = plan_of(cfg)
    assert not plan.line and not plan.acts and plan.mode is Mode.OFF
    assert not plan.checks_deployment and not plan.watches_peers
    assert plan.batches_in_flight is None and plan.scheduler is None
    assert not str(cfg.parallel_config.worker_cls).startswith("vllm_ppspec")
    assert PLAN_KEY not in cfg.additional_config  # the config (and its hash) is vLLM's


def test_a_line_vllms_own_worker_serves_still_checks_the_deployment(models, monkeypatch):
    """``VLLM_PPSPEC_AUTO=0`` on a line the plugin serves: vLLM's worker, and the
    rank posts its decision (a host beside it that acts must see it)."""
    monkeypatch.setenv("VLLM_PPSPEC_AUTO", "0")
    cfg = _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
    plan = plan_of(cfg)
    assert plan.line and not plan.worker and plan.mode is Mode.OFF
    assert plan.checks_deployment and not plan.watches_peers


def test_the_plan_travels_with_the_config_and_is_not_decided_again(models):
    cfg = _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
    settled = plan_of(cfg)
    assert plan_of(pickle.loads(pickle.dumps(cfg))) == settled
    assert isinstance(cfg.compute_hash(), str)  # vLLM hashes additional_config as JSON
    # Changed after __post_init__: the settled plan stands (decided once), while
    # a fresh decision would differ.
    cfg.scheduler_config.async_scheduling = True
    assert decide(cfg).mode is Mode.LANES
    assert plan_of(cfg) is settled and cfg.max_concurrent_batches == 2


def test_vllms_replace_keeps_the_plan_and_settles_the_new_config_alone(models):
    """vLLM makes a draft model's config with ``config.utils.replace``, which
    rebuilds the config from its fields: an attribute outside them made it
    raise ("Field ... not found in VllmConfig") in every draft-model worker."""
    from vllm.config.utils import replace

    cfg = _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
    settled = plan_of(cfg)
    before = dict(cfg.additional_config)
    parallel = replace(cfg.parallel_config, pipeline_parallel_size=1)
    new = replace(cfg, parallel_config=parallel)
    assert plan_of(new) == decide(new) and plan_of(new).pp == 1 and not plan_of(new).line
    assert PLAN_KEY not in new.additional_config
    assert cfg.additional_config == before and plan_of(cfg) == settled
    same = replace(cfg)
    assert plan_of(same) == settled


SWITCHES = {
    "VLLM_PPSPEC_DRAFTER_STAGE": "first",
    "VLLM_PPSPEC_LAYER_SPLIT": "measured",
    "VLLM_PPSPEC_ONE_BATCH": "1",
    "VLLM_PPSPEC_ADAPTIVE_K": "1",
}


def test_the_plan_carries_every_switch_and_its_readers_read_the_plan(models, monkeypatch):
    """The switches are read once, when the config is settled: with the
    environment emptied afterwards, the plan and every reader of it (the split's
    estimate, the batches in flight, the measured rule, adaptive K) still say
    what was decided."""
    from types import SimpleNamespace

    from vllm_ppspec.adaptive_k.chooser import start
    from vllm_ppspec.choice.stage_work import drafter_on_first_stage
    from vllm_ppspec.runner import stage_speed

    for name, value in SWITCHES.items():
        monkeypatch.setenv(name, value)
    cfg = _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
    for name in SWITCHES:
        monkeypatch.delenv(name)
    plan = plan_of(cfg)
    assert (plan.drafter_first, plan.drafter_why, plan.split_rule) == (
        True,
        "VLLM_PPSPEC_DRAFTER_STAGE=first",
        "measured",
    )
    assert plan.one_batch and plan.adaptive_k
    assert plan.agreed() == {
        "mode": "sync",
        "drafter stage ($VLLM_PPSPEC_DRAFTER_STAGE)": "first",
        "layer split rule ($VLLM_PPSPEC_LAYER_SPLIT)": "measured",
        "$VLLM_PPSPEC_ONE_BATCH": "1",
        "$VLLM_PPSPEC_ADAPTIVE_K": "1",
    }
    assert drafter_on_first_stage(cfg)
    assert cfg.max_concurrent_batches == plan.batches_in_flight == 1
    assert stage_speed.applies(cfg)
    sched = SimpleNamespace(
        vllm_config=cfg, num_spec_tokens=3, scheduler_config=cfg.scheduler_config
    )
    assert start(sched) is not None  # adaptive K on, from the plan alone


def test_a_bad_switch_is_refused_where_the_plugin_serves_and_unread_elsewhere(models, monkeypatch):
    monkeypatch.setenv("VLLM_PPSPEC_DRAFTER_STAGE", "middle")
    monkeypatch.setenv("VLLM_PPSPEC_LAYER_SPLIT", "fastest")
    # A line the plugin leaves to vLLM (PP = 2 without spec) does not read them.
    assert plan_of(_config(models, pipeline_parallel_size=2)).mode is Mode.OFF
    with pytest.raises(ValueError, match="VLLM_PPSPEC_DRAFTER_STAGE='middle'"):
        _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
    monkeypatch.setenv("VLLM_PPSPEC_DRAFTER_STAGE", "last")
    with pytest.raises(ValueError, match="VLLM_PPSPEC_LAYER_SPLIT='fastest'"):
        _config(models, pipeline_parallel_size=2, speculative_config=_spec(models))
