"""The plan of one engine configuration: decided once, read by every place that asks.

A :class:`Plan` says who serves (:attr:`Plan.worker`, :attr:`Plan.line`,
:attr:`Plan.acts`), the mode (:mod:`.policy`), the batches in flight, the
scheduler, whether the ranks compare their decisions at start-up
(:attr:`Plan.checks_deployment`) and whether the PP ranks watch each other
(:attr:`Plan.watches_peers`). The config patch settles it at the end of
``VllmConfig.__post_init__`` (:func:`settle`: stored on the config, which the
workers receive with it); every reader calls :func:`plan_of`:

* the config patches (``patches/config/``): the V1 runner kept, the refusals,
  the batches in flight, the scheduler, the kept CPU ``--async-scheduling``,
  the stop grace, the deployment check;
* the layer split (:mod:`.layer_split`), in the plugin's worker;
* the runner (``runner/mixin.py``): its steps, the peer watch, and the rule
  that a failing rank ends the engine (``runner/health/rank_errors.py``).

Inside ``__post_init__``, before vLLM settles async scheduling, the patch reads
:func:`decide` for what does not depend on it (who serves).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_ppspec.choice import policy
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.choice.worker import line_of, plugin_line, plugin_named

# The settled plan, on the VllmConfig it was decided for.
PLAN_ATTR = "_vllm_ppspec_plan"


@dataclass(frozen=True)
class Plan:
    worker: bool  # the config names the plugin's worker (selected by the plugin or the user)
    line: bool  # speculative decoding the plugin serves (worker.plugin_line), whoever's worker
    mode: Mode
    pp: int

    @property
    def acts(self) -> bool:
        """The plugin acts: its worker, on one of its lines. Elsewhere its worker,
        if named, runs as vLLM's V1 worker with the mode off."""
        return self.worker and self.line

    @property
    def serves_pp(self) -> bool:
        """The plugin runs its PP steps (the mode is not OFF: it acts at PP > 1)."""
        return self.mode is not Mode.OFF

    @property
    def batches_in_flight(self) -> int | None:
        """The engine's batches in flight, or None for vLLM's own."""
        return policy.batches_in_flight(self.mode, self.pp) if self.serves_pp else None

    @property
    def scheduler(self) -> str | None:
        """The plugin's scheduler's qualified name, or None for vLLM's own."""
        return policy.scheduler_of(self.mode)

    @property
    def checks_deployment(self) -> bool:
        """Post this rank's decision and compare (``choice/deployment.py``): on a
        line the plugin serves, whoever's worker. Where no rank can act (no
        speculative config; PP = 1 and DP = 1) nothing is posted or watched."""
        return self.line

    @property
    def watches_peers(self) -> bool:
        """The PP ranks watch each other (``runner/health/peer_watch.py``)."""
        return self.serves_pp


# A runner before its set-up, or a config the plugin does not serve.
OFF = Plan(worker=False, line=False, mode=Mode.OFF, pp=1)


def decide(vllm_config: Any) -> Plan:
    """The plan of ``vllm_config`` as it stands (a model runner, which holds
    the same configs, works too)."""
    pp, dp, method, moe = line_of(vllm_config)
    parallel = vllm_config.parallel_config
    worker = plugin_named(getattr(parallel, "worker_cls", None))
    line = plugin_line(pp, dp, method, moe)
    scheduler = getattr(vllm_config, "scheduler_config", None)
    mode = policy.mode_of(
        worker and line,
        pp,
        bool(getattr(scheduler, "async_scheduling", False)),
        getattr(parallel, "distributed_executor_backend", None) == "external_launcher",
    )
    return Plan(worker=worker, line=line, mode=mode, pp=pp)


def settle(vllm_config: Any) -> Plan:
    """Decide the plan and keep it on the config (end of ``__post_init__``)."""
    plan = decide(vllm_config)
    object.__setattr__(vllm_config, PLAN_ATTR, plan)
    return plan


def plan_of(vllm_config: Any) -> Plan:
    """The config's settled plan; decided now for a config that has none."""
    plan = getattr(vllm_config, PLAN_ATTR, None)
    return plan if isinstance(plan, Plan) else decide(vllm_config)


def headless_node(parallel_config: Any) -> bool:
    """This worker's executor is a headless ``vllm serve``'s (its parent process)."""
    backend = parallel_config.distributed_executor_backend
    return backend == "mp" and parallel_config.node_rank_within_dp > 0
