"""Every rank of a line the plugin serves decided the same, compared at start-up.

Each host and each DP replica builds its config from its own command line and
environment, so each decides alone who serves (:mod:`vllm_ppspec.choice.worker`):
a host with ``VLLM_PPSPEC_AUTO=0``, ``VLLM_USE_V2_MODEL_RUNNER=1`` or no
``--speculative-config`` would run vLLM's own worker beside the plugin's.
The config patch ``patches/config/deployment_check.py`` runs :func:`check` in
the workers, whatever their class, right after vLLM's ``initialize_model_parallel``
built the groups, where the world group has more than one rank and the plan
checks the deployment (``Plan.checks_deployment``: a line the plugin serves,
whoever's worker; where no rank can act, with no speculative config or at
PP = 1 and DP = 1, nothing is posted and no thread starts):

* every rank posts :func:`decision_of` (the worker, the runner, the plugin's
  mode and vLLM's release, :data:`DECISION_FIELDS`, with the settings behind
  them and its host) on the world group's store
  (:mod:`vllm_ppspec.protocol.decision_board`); posting never waits;
* where the plugin acts (``Plan.acts``) the rank waits until every
  rank posted. A rank that posted another decision is refused at once, on
  every rank: :class:`DeploymentMismatchError` names each field and setting
  that differs, its value on each rank, and the host of each rank that decided
  otherwise. A rank that posted nothing within ``VLLM_PPSPEC_STARTUP_TIMEOUT``
  has no vllm-ppspec on its host: it is named so;
* where the plugin does not act (vLLM's Model Runner V2 picked,
  ``VLLM_PPSPEC_AUTO=0``, ...) nothing waits: a thread reads the board until
  the start-up timeout and ends this worker if a rank that acts refused the
  deployment.

The plugin's runner compares its own fields later
(``runner/health/startup_check.py``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from vllm_ppspec.choice.plan import Plan
from vllm_ppspec.choice.worker import AUTO_ENV, platform_name
from vllm_ppspec.compat.guard import installed_vllm_version
from vllm_ppspec.protocol import decision_board
from vllm_ppspec.protocol.agreement import TIMEOUT_ENV, host_label, timeout_s

DECISION_FIELDS = ("worker", "runner", "mode", "vLLM release")
# Posted for the messages, never compared.
WHERE_FIELDS = ("host", "node rank")
V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
EXIT_CODE = 1


class DeploymentMismatchError(RuntimeError):
    """Ranks of one deployment decided differently who serves; raised on every rank."""


def decision_of(vllm_config: Any, mode: str) -> dict[str, str]:
    """This rank's decision (:data:`DECISION_FIELDS`), the settings behind it
    and where it runs (:data:`WHERE_FIELDS`)."""
    spec = vllm_config.speculative_config
    host = host_label()
    return {
        "worker": str(vllm_config.parallel_config.worker_cls),
        "runner": "Model Runner V2" if vllm_config.use_v2_model_runner else "V1",
        "mode": mode,
        "vLLM release": installed_vllm_version(),
        f"${AUTO_ENV}": os.environ.get(AUTO_ENV, "<unset>"),
        f"${V2_ENV}": os.environ.get(V2_ENV, "<unset>"),
        "platform": platform_name(),
        "speculative method": "<none>" if spec is None else str(spec.method),
        "host": host,
        "node rank": str(getattr(vllm_config.parallel_config, "node_rank", 0)),
    }


def _decided(p: dict[str, str]) -> dict[str, str]:
    return {k: p.get(k, "<unset>") for k in DECISION_FIELDS}


def differences(seen: dict[int, dict[str, str]]) -> list[str]:
    """One line per field not the same on every rank of ``seen`` (absent: '<unset>')."""
    keys = sorted({k for p in seen.values() for k in p})
    lines = []
    for key in keys:
        values = {r: seen[r].get(key, "<unset>") for r in sorted(seen)}
        if len(set(values.values())) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in values.items())
            lines.append(f"{key} ({per_rank})")
    return lines


def verdict(seen: dict[int, dict[str, str]], mine: dict[str, str] | None = None) -> str | None:
    """The refusal for the decisions ``seen`` (by rank), or None if they agree;
    ``mine``: the deciding rank's own, to name the ranks that decided otherwise."""
    decided = differences({r: _decided(p) for r, p in seen.items()})
    if not decided:
        return None
    settings = differences(
        {
            r: {k: v for k, v in p.items() if k not in DECISION_FIELDS + WHERE_FIELDS}
            for r, p in seen.items()
        }
    )
    text = (
        "vllm-ppspec: the ranks of this deployment decided differently who serves "
        "speculative decoding with PP or DP; start every host and DP replica with the same "
        f"vLLM, ${AUTO_ENV}, ${V2_ENV} and --speculative-config. Differs: "
        + "; ".join(decided + settings)
    )
    if mine is not None:
        others = [
            f"rank {r} on host {p.get('host', '?')} (node rank {p.get('node rank', '?')})"
            for r, p in sorted(seen.items())
            if _decided(p) != _decided(mine)
        ]
        text += ". Decided otherwise: " + ", ".join(others)
    return text


def missing_refusal(missing: list[int], world_size: int, nnodes: int, timeout: float) -> str:
    """The refusal naming the ranks that posted no decision: their hosts have no plugin."""
    per_node = world_size // nnodes if nnodes > 1 and world_size % nnodes == 0 else 0
    names = [f"rank {r}" + (f" (node rank {r // per_node})" if per_node else "") for r in missing]
    return (
        f"vllm-ppspec: {', '.join(names)} posted no decision within {timeout:.0f} s: "
        "vllm-ppspec is not installed on that host, that host was started without "
        "--speculative-config (a line where no rank can act posts nothing), or its worker "
        "did not reach vLLM's initialize_model_parallel (a host that has the plugin and "
        "decided otherwise is named at once). Install vllm-ppspec on every host of the "
        f"deployment and start each with the same --speculative-config. {TIMEOUT_ENV} "
        "sets the wait."
    )


def check(vllm_config: Any, board: Any, rank: int, world_size: int, plan: Plan) -> None:
    """Post this rank's decision; where the plugin acts, wait for every rank's
    and raise :class:`DeploymentMismatchError` on a difference or a rank that
    posted none; elsewhere watch for a refusal from a thread
    (:func:`end_process` ends this worker then)."""
    mine = decision_of(vllm_config, plan.mode.value)
    decision_board.post(board, rank, mine)
    timeout = timeout_s()
    if not plan.acts:
        decision_board.watch(board, rank, timeout + 5.0, end_process)
        return

    def differs(seen: dict[int, dict[str, str]]) -> bool:
        return any(_decided(p) != _decided(mine) for p in seen.values())

    seen, refusal = decision_board.await_all(board, world_size, differs, timeout)
    if refusal is None:
        refusal = verdict(seen, mine)
    if refusal is None and len(seen) < world_size:
        missing = [r for r in range(world_size) if r not in seen]
        nnodes = int(getattr(vllm_config.parallel_config, "nnodes", 1))
        refusal = missing_refusal(missing, world_size, nnodes, timeout)
    if refusal is None:
        return
    watchers = [r for r, p in seen.items() if _decided(p) != _decided(mine)]
    raise DeploymentMismatchError(decision_board.refuse(board, refusal, watchers))


def end_process(refusal: str) -> None:
    """A rank the plugin does not serve, in a deployment a serving rank refused:
    log the refusal and end this worker (vLLM's executor sees it die)."""
    from vllm.logger import init_logger

    init_logger("vllm.ppspec").error("%s (this rank decided otherwise: ending it)", refusal)
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_CODE)
