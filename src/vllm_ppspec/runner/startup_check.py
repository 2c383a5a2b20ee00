"""PP ranks agree at start-up that they run the same plugin the same way.

On one host every worker comes from one command line. Across hosts each node
builds its own config from its own command line and environment, and a
difference (another ``--speculative-config``, a ``VLLM_PPSPEC_*`` switch set
on one node, another vLLM or plugin version, a node without the plugin's
worker) would leave the ranks running different protocols: wrong tokens or a
collective that never returns. So before any other collective of the plugin,
every PP rank of a PP + spec runner calls :func:`agree` on the PP group's gloo
group, in this order:

1. ``monitored_barrier`` (gloo) with a timeout: a rank that never arrives (a
   node started without the plugin's worker, or without speculation, which
   skips this) is named by torch's error within the timeout, on every rank
   that did arrive;
2. ``all_gather_object`` of each rank's fingerprint (a flat dict of strings).

Every rank then compares all fingerprints with the same data, so every rank
raises the same :class:`StartupMismatchError` naming each field that differs
and its value on each rank, or none does.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

TIMEOUT_ENV = "VLLM_PPSPEC_STARTUP_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0


class StartupMismatchError(RuntimeError):
    """PP ranks were started differently; raised on every rank."""


def timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def fingerprint(runner: Any, mode: str) -> dict[str, str]:
    """What must be equal on every PP rank, as strings."""
    import vllm

    from vllm_ppspec import __version__

    spec = runner.speculative_config
    draft = getattr(spec, "draft_model_config", None)
    hf = getattr(draft, "hf_config", None)
    fields = {
        "vllm-ppspec version": __version__,
        "vLLM version": str(getattr(vllm, "__version__", "unknown")),
        "mode": mode,
        "pipeline_parallel_size": str(runner.parallel_config.pipeline_parallel_size),
        "speculative method": str(spec.method),
        "num_speculative_tokens": str(spec.num_speculative_tokens),
        "draft architectures": str(getattr(hf, "architectures", None)),
        "draft hidden_size": str(getattr(hf, "hidden_size", None)),
        "max_num_seqs": str(runner.scheduler_config.max_num_seqs),
    }
    for name in sorted(os.environ):
        if name.startswith("VLLM_PPSPEC_") and name != TIMEOUT_ENV:
            fields[f"${name}"] = os.environ[name]
    return fields


def differences(prints: list[dict[str, str]]) -> list[str]:
    """One line per field that is not the same on every rank (absent: '<unset>')."""
    keys = sorted({k for p in prints for k in p})
    lines = []
    for key in keys:
        values = [p.get(key, "<unset>") for p in prints]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v!r}" for r, v in enumerate(values))
            lines.append(f"{key} ({per_rank})")
    return lines


def agree(group: Any, mine: dict[str, str], timeout: float | None = None) -> None:
    """Collective on ``group`` (gloo), every rank: see the module docstring."""
    timeout = timeout_s() if timeout is None else timeout
    try:
        dist.monitored_barrier(
            group=group, timeout=datetime.timedelta(seconds=timeout), wait_all_ranks=True
        )
    except RuntimeError as e:
        raise StartupMismatchError(
            f"vllm-ppspec: a PP rank did not reach the plugin's start-up check within "
            f"{timeout:.0f} s ({e}). Start every node with the same --speculative-config "
            "and the plugin's worker (--worker-cls auto or vllm_ppspec.worker.PPSpecWorker); "
            f"{TIMEOUT_ENV} sets the wait."
        ) from e
    prints: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(prints, mine, group=group)
    diff = differences(prints)
    if diff:
        raise StartupMismatchError(
            "vllm-ppspec: the PP ranks were started differently; start every node with "
            "the same vLLM, vllm-ppspec, speculative config and VLLM_PPSPEC_* switches. "
            "Differs: " + "; ".join(diff)
        )
