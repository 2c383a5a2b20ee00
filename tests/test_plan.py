"""One plan per engine configuration (``choice/plan.py``), settled once and read by every place.

Real ``VllmConfig`` objects through ``EngineArgs`` on a tiny local model (no
engine started): the plan settled at the end of ``__post_init__`` says who
serves, the mode, the batches in flight, the scheduler, whether the ranks
check the deployment and watch each other, and what vLLM's config reports
(``max_concurrent_batches``, the scheduler class) is what the plan says. The
plan travels with the config to the workers (pickled), and a config that
changes after it was settled keeps its plan: nothing decides twice.
"""

from __future__ import annotations

import pickle

import pytest

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.choice.plan import PLAN_ATTR, Plan, decide, plan_of
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
    plan = getattr(cfg, PLAN_ATTR)
    assert plan == Plan(worker=True, line=True, mode=Mode.SYNC, pp=2)
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
    assert pickle.loads(pickle.dumps(cfg)).__dict__[PLAN_ATTR] == settled
    # Changed after __post_init__: the settled plan stands (decided once), while
    # a fresh decision would differ.
    cfg.scheduler_config.async_scheduling = True
    assert decide(cfg).mode is Mode.LANES
    assert plan_of(cfg) is settled and cfg.max_concurrent_batches == 2
