"""The DP agreement hooked onto one drafter instance, and its dummy runs' KV slots.

:func:`install` wraps ``propose``, ``dummy_run`` and
``_determine_batch_execution_and_padding`` on a drafter (the class is
untouched; ``vllm_ppspec.compat.registry.REGISTRY`` lists them) so that each drafter
run agrees with the other DP ranks' before its first forward, by the protocol
of :mod:`vllm_ppspec.protocol.dp_agreement` (which ranks, when, in what
order, and what a disagreement does).

:func:`clear_dummy_slots` keeps a dummy batch's drafter forwards out of the
drafter's KV cache (the runner calls it before each ``_dummy_run``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from vllm_ppspec.protocol.dp_agreement import Agreement, agree, check_coordination


def forwards_of_propose(drafter: Any, num_speculative_tokens: int) -> int:
    """Drafter forwards ``SpecDecodeBaseProposer.propose`` runs (one, then k - 1 more)."""
    if num_speculative_tokens <= 1 or drafter.parallel_drafting:
        return 1
    return int(num_speculative_tokens)


def forwards_of_dummy_run(drafter: Any, is_graph_capturing: bool) -> int:
    """Drafter forwards ``SpecDecodeBaseProposer.dummy_run`` runs."""
    if is_graph_capturing or drafter.parallel_drafting:
        return 1
    return int(drafter.num_speculative_tokens)


# vLLM's slot id for "write no K/V here" (vllm/v1/spec_decode/utils.py).
PADDING_SLOT_ID = -1


def clear_dummy_slots(drafter: Any) -> None:
    """Before a dummy batch: the drafter's own slot-mapping buffer, all padding.

    A dummy batch has no KV slots. vLLM fills the target's slot mappings with
    ``PADDING_SLOT_ID``, but ``SpecDecodeBaseProposer.dummy_run``, when those
    mappings name the drafter's layers, uses the drafter's own buffer
    (``_get_slot_mapping``), which still holds the last proposal's slots. Its
    forwards then write K/V into a live request's drafter cache, garbage from
    the second layer on (attention without metadata returns its output
    unwritten). At DP > 1 under PP the engine runs dummy batches between a busy
    rank's own steps (a step that only waits for the pipeline executes nothing),
    so the request is this rank's and its drafts go wrong."""
    slots = getattr(drafter, "_slot_mapping_buffer", None)
    if isinstance(slots, torch.Tensor):
        slots.fill_(PADDING_SLOT_ID)


class _Hook:
    """Per-drafter state: the run count and the run in progress."""

    def __init__(self, group: Any, dp_rank: int, disagree_at: int) -> None:
        self.group = group
        self.dp_rank = dp_rank
        self.disagree_at = disagree_at  # n-th propose on DP rank 1 lies (fault); 0: never
        self.runs = 0
        self.proposes = 0
        self.pending: tuple[bool, int] | None = None  # (drafts, forwards) until agreed
        self.current: Agreement | None = None
        self.last: Agreement | None = None


def install(drafter: Any, group: Any, dp_rank: int, disagree_at: int = 0) -> None:
    """Wrap ``propose``, ``dummy_run`` and ``_determine_batch_execution_and_padding``
    on this drafter instance (the class is untouched)."""
    if getattr(drafter, "_ppspec_dp_hook", None) is not None:
        return
    hook = _Hook(group, dp_rank, disagree_at)
    drafter._ppspec_dp_hook = hook

    def run(
        fn: Callable[..., Any], drafts: bool, forwards: Callable[..., int]
    ) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            n = forwards(*args, **kwargs)
            if drafts:
                hook.proposes += 1
                if hook.dp_rank == 1 and hook.proposes == hook.disagree_at:
                    n += 1  # fault injection: this rank misreports its forwards
            hook.pending, hook.current = (drafts, n), None
            try:
                return fn(*args, **kwargs)
            finally:
                hook.runs += 1
                hook.pending = None
                if hook.current is not None:
                    hook.last = hook.current
                hook.current = None

        return wrapper

    def propose_forwards(num_speculative_tokens: int, *args: Any, **kwargs: Any) -> int:
        return forwards_of_propose(drafter, num_speculative_tokens)

    def dummy_forwards(
        num_tokens: int,
        use_cudagraphs: bool = True,
        is_graph_capturing: bool = False,
        slot_mappings: Any = None,
    ) -> int:  # dummy_run's own signature
        return forwards_of_dummy_run(drafter, is_graph_capturing)

    determine = drafter._determine_batch_execution_and_padding

    @functools.wraps(determine)
    def determine_wrapper(num_tokens: int, *args: Any, **kwargs: Any) -> Any:
        if hook.pending is not None:  # the run's first coordination: agree first
            drafts, forwards = hook.pending
            hook.pending = None
            hook.current = agree(hook.group, hook.dp_rank, hook.runs, drafts, forwards, num_tokens)
            result = determine(num_tokens, *args, **kwargs)
            check_coordination(hook.current, result[2], hook.dp_rank)
            return result
        return determine(num_tokens, *args, **kwargs)

    drafter.propose = run(drafter.propose, True, propose_forwards)
    drafter.dummy_run = run(drafter.dummy_run, False, dummy_forwards)
    drafter._determine_batch_execution_and_padding = determine_wrapper


def install_for_runner(runner: Any) -> None:
    """On a runner whose drafter has a model forward, at DP > 1, :func:`install`
    the DP agreement on the DP group's gloo ``cpu_group`` (in every mode)."""
    from vllm.distributed.parallel_state import get_dp_group
    from vllm.logger import init_logger
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    from vllm_ppspec.protocol import faults

    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, SpecDecodeBaseProposer):  # none here, or no model forward
        return
    if runner.parallel_config.data_parallel_size <= 1:
        return
    fault = faults.Faults.from_env()
    dp = get_dp_group()
    install(
        drafter,
        dp.cpu_group,
        dp.rank_in_group,
        disagree_at=fault.at_step if fault.kind == "dp_disagree" else 0,
    )
    init_logger("vllm.ppspec").info(
        "vllm-ppspec: drafter runs agreed across DP (rank %d of %d) on the DP gloo group",
        dp.rank_in_group,
        dp.world_size,
    )
