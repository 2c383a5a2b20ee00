"""The plan of one engine configuration: decided once, read by every place that asks.

A :class:`Plan` says who serves (:attr:`Plan.worker`, :attr:`Plan.line`,
:attr:`Plan.acts`), the mode (:mod:`.policy`), the batches in flight, the
scheduler, whether the ranks compare their decisions at start-up
(:attr:`Plan.checks_deployment`) and whether the PP ranks watch each other
(:attr:`Plan.watches_peers`). The config patch settles it at the end of
``VllmConfig.__post_init__`` (:func:`settle`); every reader calls :func:`plan_of`.
On a line the plugin serves the plan is written into the config's
``additional_config`` (vLLM's slot for platform and plugin settings: a field,
so it travels with the config to the workers and through vLLM's
``config.utils.replace``, which keeps only fields), as plain values under
:data:`PLAN_KEY`. Elsewhere nothing is written (the config and its hash stay
vLLM's) and :func:`plan_of` decides the plan, which is off. The readers:

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

import functools
from dataclasses import dataclass
from typing import Any

from vllm_ppspec.choice import policy
from vllm_ppspec.choice.policy import Mode
from vllm_ppspec.choice.worker import line_of, plugin_line, plugin_named

# The settled plan's key in ``VllmConfig.additional_config``.
PLAN_KEY = "vllm_ppspec_plan"


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
    """Decide the plan and keep it on the config (end of ``__post_init__``).

    A new ``additional_config`` dict: a config made by ``replace`` from another
    shares the other's dict and is settled again on its own."""
    plan = decide(vllm_config)
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict) and (plan.line or PLAN_KEY in extra):
        extra = {k: v for k, v in extra.items() if k != PLAN_KEY}
        if plan.line:
            extra[PLAN_KEY] = _values(plan)
        object.__setattr__(vllm_config, "additional_config", extra)
    return plan


def plan_of(vllm_config: Any) -> Plan:
    """The config's settled plan; decided now for a config that has none."""
    extra = getattr(vllm_config, "additional_config", None)
    values = extra.get(PLAN_KEY) if isinstance(extra, dict) else None
    if not isinstance(values, dict):
        return decide(vllm_config)
    return _plan(values["worker"], values["line"], values["mode"], values["pp"])


def _values(plan: Plan) -> dict[str, Any]:
    # Plain values: vLLM hashes additional_config as JSON (VllmConfig.compute_hash).
    return {"worker": plan.worker, "line": plan.line, "mode": plan.mode.name, "pp": plan.pp}


@functools.lru_cache(maxsize=64)
def _plan(worker: bool, line: bool, mode: str, pp: int) -> Plan:
    return Plan(worker=worker, line=line, mode=Mode[mode], pp=pp)


def headless_node(parallel_config: Any) -> bool:
    """This worker's executor is a headless ``vllm serve``'s (its parent process)."""
    backend = parallel_config.distributed_executor_backend
    return backend == "mp" and parallel_config.node_rank_within_dp > 0
