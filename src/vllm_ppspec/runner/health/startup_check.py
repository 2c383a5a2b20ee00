"""PP ranks agree at start-up that they run the same plugin the same way.

On one host every worker comes from one command line. Across hosts each node
builds its own config from its own command line and environment, and a
difference (another ``--speculative-config``, a ``VLLM_PPSPEC_*`` switch set
on one node, another vLLM, a plugin that speaks another protocol, a node
without the plugin's worker) would leave the ranks running different
protocols: wrong tokens or a collective that never returns. So before any
other collective of the plugin, every PP rank of a PP + spec runner calls
:func:`agree` on the PP group's gloo group, in this order:

1. ``monitored_barrier`` (gloo) with a timeout: a rank that never arrives (a
   node started without the plugin's worker, or without speculation, which
   skips this) is named by torch's error within the timeout, on every rank
   that did arrive;
2. ``all_gather_object`` of each rank's fingerprint (a flat dict of strings)

(:func:`vllm_ppspec.protocol.agreement.gather`). Every rank then compares all
fingerprints with the same data, so every rank raises the same
:class:`StartupMismatchError` or none does. The protocol number
(:data:`vllm_ppspec.protocol.PROTOCOL`) is compared first: ranks that speak
different protocols are refused naming the protocol alone, since the other
fields of another protocol need not mean the same. Otherwise the error names
each field that differs and its value on each rank.

The fingerprint holds only what must be equal on every rank: the protocol,
vLLM's release (the messages vLLM's own code sends between the ranks; a local
label such as ``+cu128`` is not compared), the mode, the pipeline size, the
speculative method, ``k``, the draft's shape, ``max_num_seqs``, the target's
layer split (``VLLM_PP_LAYER_PARTITION`` as the user set it or
:mod:`vllm_ppspec.choice.layer_split` chose it), and the switches of
:data:`AGREED_SWITCHES`, each as the plugin reads it (unset reads as its
default). The plugin's own version is not in it: two builds that speak the same
protocol work together. The variables of :data:`HOST_LOCAL_SWITCHES` may differ
between hosts.
"""

from __future__ import annotations

import os
from typing import Any

from vllm_ppspec.compat.guard import installed_vllm_version
from vllm_ppspec.protocol.agreement import (
    TIMEOUT_ENV,
    RankMissingError,
    differences,
    gather,
    host_label,
    timeout_s,
)

PROTOCOL_FIELD = "protocol"

# VLLM_PPSPEC_* on/off switches that change the mode or what goes on the wire,
# so every PP rank must read them the same: name -> the value an unset one reads
# as. Each is compared as the plan read it (Plan.agreed: "1" or "0").
AGREED_SWITCHES: dict[str, str] = {
    # Sync: batches in flight (max_concurrent_batches, which workers size buffers by).
    "VLLM_PPSPEC_ONE_BATCH": "0",
    # Adaptive K: where it is on, the config holds a stand-in schedule and vLLM
    # captures CUDA graphs piecewise (adaptive_k/__init__.py): every host alike.
    "VLLM_PPSPEC_ADAPTIVE_K": "0",
}
# VLLM_PPSPEC_* variables that may differ between hosts: name -> why.
HOST_LOCAL_SWITCHES: dict[str, str] = {
    TIMEOUT_ENV: "how long this rank waits here",
    "VLLM_PPSPEC_DP_AGREE_TIMEOUT": "how long this rank waits for its DP peers",
    "VLLM_PPSPEC_PEER_KEEPALIVE_S": "how soon this rank's peer watch gives up on a peer",
    "VLLM_PPSPEC_AUTO": "compared by the decision it leads to (patches/config/deployment_check.py)",
    "VLLM_PPSPEC_CPU_COMPILED_CORRECTION": "the same correction, compiled or eager",
    "VLLM_PPSPEC_FAULT": "tests: a fault injected on this host's ranks",
    "VLLM_PPSPEC_FAULT_SKIP_ACCEPTED_COUNTS": "tests: a fault injected on this host's ranks",
    "VLLM_PPSPEC_HOME": "tools: this host's cache and results directory",
    "VLLM_PPSPEC_CACHE": "tools: this host's cache directory",
    "VLLM_PPSPEC_ADAPTIVE_K_BATCHES": "read by the engine core's scheduler alone",
}
# VLLM_PPSPEC_* variables of more than two values, each compared as the plan's
# decision in a field of its own (Plan.agreed): name -> the field.
COMPARED_AS_FIELDS: dict[str, str] = {
    "VLLM_PPSPEC_LAYER_SPLIT": "layer split rule ($VLLM_PPSPEC_LAYER_SPLIT)",
    "VLLM_PPSPEC_DRAFTER_STAGE": "drafter stage ($VLLM_PPSPEC_DRAFTER_STAGE)",
}
# Where the rank runs: in the fingerprint for the messages, never compared.
HOST_FIELD = "host"


class StartupMismatchError(RuntimeError):
    """PP ranks were started differently; raised on every rank."""


def fingerprint(runner: Any, plan: Any) -> dict[str, str]:
    """What must be equal on every PP rank, as strings; ``plan``: the runner's
    :class:`~vllm_ppspec.choice.plan.Plan`, whose decisions are compared by the
    setting behind each (``Plan.agreed``)."""
    from vllm_ppspec import protocol
    from vllm_ppspec.choice import policy

    spec = runner.speculative_config
    draft = getattr(spec, "draft_model_config", None)
    hf = getattr(draft, "hf_config", None)
    fields = {
        PROTOCOL_FIELD: str(protocol.PROTOCOL),
        "vLLM version": installed_vllm_version(),
        "pipeline_parallel_size": str(runner.parallel_config.pipeline_parallel_size),
        "speculative method": str(spec.method),
        "num_speculative_tokens": str(spec.num_speculative_tokens),
        "draft architectures": str(getattr(hf, "architectures", None)),
        "draft hidden_size": str(getattr(hf, "hidden_size", None)),
        "max_num_seqs": str(runner.scheduler_config.max_num_seqs),
        # The plugin's balanced split or the user's (layer_split.py).
        f"target layer split (${policy.SPLIT_ENV})": os.environ.get(
            policy.SPLIT_ENV, "vLLM's even split"
        ),
        **plan.agreed(),
        HOST_FIELD: host_label(),
    }
    return fields


def agree(group: Any, mine: dict[str, str], timeout: float | None = None) -> None:
    """Collective on ``group`` (gloo), every rank: see the module docstring."""
    timeout = timeout_s() if timeout is None else timeout
    try:
        prints = gather(group, mine, timeout)
    except RankMissingError as e:
        raise StartupMismatchError(
            f"vllm-ppspec: a PP rank did not reach the plugin's start-up check within "
            f"{timeout:.0f} s ({e}). Start every node with the same --speculative-config "
            "and the plugin's worker (--worker-cls auto or vllm_ppspec.worker.PPSpecWorker); "
            f"{TIMEOUT_ENV} sets the wait."
        ) from e
    # The protocol first, alone: another protocol's fields need not mean the same.
    protocols = differences(
        [{PROTOCOL_FIELD: p[PROTOCOL_FIELD]} if PROTOCOL_FIELD in p else {} for p in prints]
    )
    hosts = ", ".join(f"rank {r}: {p.get(HOST_FIELD, '?')}" for r, p in enumerate(prints))
    if protocols:
        raise StartupMismatchError(
            "vllm-ppspec: the PP ranks speak different versions of the plugin's protocol; "
            "install a vllm-ppspec of the same protocol on every node. Differs: "
            + "; ".join(protocols)
            + f". Hosts: {hosts}"
        )
    diff = differences(prints, ignored=(HOST_FIELD,))
    if diff:
        raise StartupMismatchError(
            "vllm-ppspec: the PP ranks were started differently; start every node with "
            f"the same vLLM, speculative config and "
            f"{', '.join([*AGREED_SWITCHES, *COMPARED_AS_FIELDS])}. "
            "Differs: " + "; ".join(diff) + f". Hosts: {hosts}"
        )
