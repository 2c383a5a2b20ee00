"""The plan of one engine configuration: decided once, read by every place that asks.

A :class:`Plan` says who serves (:attr:`Plan.worker`, :attr:`Plan.line`,
:attr:`Plan.acts`), the mode (:mod:`.policy`), the batches in flight, the
scheduler, where the drafter runs (:attr:`Plan.drafter_first`, with the
reason it stays on the last stage), the layer split's rule, adaptive K,
whether the ranks compare their decisions at start-up
(:attr:`Plan.checks_deployment`) and whether the PP ranks watch each other
(:attr:`Plan.watches_peers`). The plugin's switches (``VLLM_PPSPEC_*``) are
read here, once, where the plugin serves PP (elsewhere they are not read: a
line the plugin leaves alone takes no error from them); every host decides
from its own environment and the runners compare :meth:`Plan.agreed` across
the PP ranks at start-up (``runner/health/startup_check.py``). The config patch
settles it at the end of ``VllmConfig.__post_init__`` (:func:`settle`); every
reader calls :func:`plan_of`.
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

import dataclasses
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
    # Where the plugin serves PP (mode not OFF); the defaults elsewhere.
    one_batch: bool = False  # sync: one batch in flight instead of PP
    drafter_first: bool = False  # the draft model runs on the first stage
    drafter_why: str = ""  # why the drafter runs where it does (where it can run first)
    split_rule: str = "weights"  # the layer split's rule (choice/layer_split.py)
    adaptive_k: bool = False  # the plugin's schedulers choose K (adaptive_k/)

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
        if not self.serves_pp:
            return None
        return policy.batches_in_flight(self.mode, self.pp, self.one_batch)

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

    def agreed(self) -> dict[str, str]:
        """The decisions every PP rank must share, by the setting that leads to each
        (the start-up check's fields: ``runner/health/startup_check.py``)."""
        return {
            "mode": self.mode.value,
            f"drafter stage (${policy.DRAFTER_STAGE_ENV})": (
                "first" if self.drafter_first else "last"
            ),
            f"layer split rule (${policy.SPLIT_RULE_ENV})": self.split_rule,
            f"${policy.ONE_BATCH_ENV}": "1" if self.one_batch else "0",
            f"${policy.ADAPTIVE_K_ENV}": "1" if self.adaptive_k else "0",
        }


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
    return with_switches(Plan(worker=worker, line=line, mode=mode, pp=pp), vllm_config)


def with_switches(plan: Plan, vllm_config: Any) -> Plan:
    """``plan`` with the plugin's switches read from this process's environment,
    where it serves PP; elsewhere ``plan`` as it is. A bad value raises
    ValueError naming the variable."""
    if not plan.serves_pp:
        return plan
    why = policy.drafter_placement_of(vllm_config)
    first = why is None
    if why is None and policy.drafter_stage() == "auto":
        from vllm_ppspec.choice.drafter_stage import auto

        first, why = auto(vllm_config)
    return dataclasses.replace(
        plan,
        one_batch=policy.one_batch(),
        drafter_first=first,
        drafter_why=why or policy.STAGE_ASKED_FIRST,
        split_rule=policy.split_rule(),
        adaptive_k=policy.adaptive_k(),
    )


def settle(vllm_config: Any) -> Plan:
    """Decide the plan and keep it on the config (end of ``__post_init__``)."""
    plan = decide(vllm_config)
    keep(vllm_config, plan)
    return plan


def keep(vllm_config: Any, plan: Plan) -> None:
    """Write ``plan`` into the config's ``additional_config`` (on a line the
    plugin serves; elsewhere a plan there is taken out). A new dict: a config
    made by ``replace`` from another shares the other's dict and is settled
    again on its own."""
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict) and (plan.line or PLAN_KEY in extra):
        extra = {k: v for k, v in extra.items() if k != PLAN_KEY}
        if plan.line:
            extra[PLAN_KEY] = _values(plan)
        object.__setattr__(vllm_config, "additional_config", extra)


def plan_of(vllm_config: Any) -> Plan:
    """The config's settled plan; decided now for a config that has none."""
    extra = getattr(vllm_config, "additional_config", None)
    values = extra.get(PLAN_KEY) if isinstance(extra, dict) else None
    if not isinstance(values, dict):
        return decide(vllm_config)
    return _plan(tuple(sorted(values.items())))


def _values(plan: Plan) -> dict[str, Any]:
    # Plain values: vLLM hashes additional_config as JSON (VllmConfig.compute_hash).
    values = dataclasses.asdict(plan)
    values["mode"] = plan.mode.name
    return values


@functools.lru_cache(maxsize=64)
def _plan(items: tuple[tuple[str, Any], ...]) -> Plan:
    values = dict(items)
    values["mode"] = Mode[values["mode"]]
    return Plan(**values)


def headless_node(parallel_config: Any) -> bool:
    """This worker's executor is a headless ``vllm serve``'s (its parent process)."""
    backend = parallel_config.distributed_executor_backend
    return backend == "mp" and parallel_config.node_rank_within_dp > 0
