"""Make the DP ranks that hold drafters agree on each drafter run before it starts.

Why. vLLM keeps DP > 1 inside an engine only for MoE targets (dense DP ranks
are independent engines that see DP size 1). There every drafter forward on
one rank must be matched on the other DP ranks: the drafter's
``_determine_batch_execution_and_padding`` runs vLLM's
``coordinate_batch_across_dp`` (an all-reduce) before its first and its second
forward, and a MoE drafter's layers gather and reduce-scatter across DP in
every forward. vLLM keeps these matched by calling ``drafter.dummy_run`` where
a rank has no real drafting to do (an idle rank's dummy batch; a batch whose
input does not fit the drafter's ``max_model_len``) and relies on ``dummy_run``
issuing the same sequence as ``propose``. Here the ranks agree explicitly.

Which ranks. The ranks that hold a drafter: every rank at PP = 1, only the
last PP stage under PP (vLLM builds the drafter there only, and the plugin's
runner hides it from the other stages' dummy runs). The agreement runs on
vLLM's DP group of such a rank, on its gloo ``cpu_group`` (never the device
group). vLLM builds that group from the rank layout ``ExternalDP x DP x PP x
PCP x TP`` by moving the DP axis last (``initialize_model_parallel`` in
vllm/distributed/parallel_state.py), so it holds the ranks at the same PP, PCP
and TP position in the other DP replicas: for a last-stage rank, exactly the
other replicas' last-stage ranks, whose drafters' collectives must match.

When, and in what order. Each call of the drafter's ``propose`` or
``dummy_run`` (wrapped on the drafter instance by
:func:`vllm_ppspec.runner.drafter.dp_hook.install`) is one drafter run. At the run's
first call of ``_determine_batch_execution_and_padding``
(before its first forward and before any DP collective of the run), every rank
of the group calls one ``all_gather`` of an int64 record (:data:`FIELDS`):
this rank's count of drafter runs so far, whether it drafts (``propose``) or
only keeps step (``dummy_run``), how many drafter forwards the run will do,
and the tokens of its first forward. vLLM's own all-reduce follows. The
agreed values, the same on every rank:

(a) the drafter runs on every rank of the group, at the same run count, with
    the same number of forwards (so every forward's collectives are matched);
(b) the padded drafter batch: the largest first-forward token count of the
    group (:attr:`Agreement.padded_tokens`). vLLM's coordination must then give
    every rank at least its agreed count; otherwise the run is refused.

Disagreement. Every rank holds the same gathered table and applies the same
checks, so each raises :class:`DPAgreementError` (naming the table) before
the drafter's first forward. A rank that never arrives is waited for at most
``VLLM_PPSPEC_DP_AGREE_TIMEOUT`` seconds (default 60), then the waiting ranks
raise too. Either way the worker's error stops the engine instead of leaving
a collective unmatched.

Fault injection: ``VLLM_PPSPEC_FAULT=dp_disagree@n`` (protocol/faults.py) makes DP rank
1 report one forward more than it will run, at its n-th ``propose``.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

MAGIC = 0x5050_4450  # "PPDP": a record that is not this module's is refused too
FIELDS = ("magic", "run", "drafts", "forwards", "tokens")
TIMEOUT_ENV = "VLLM_PPSPEC_DP_AGREE_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0


class DPAgreementError(RuntimeError):
    """The DP ranks holding drafters do not agree on a drafter run."""


@dataclass(frozen=True)
class Agreement:
    run: int
    forwards: int
    tokens: tuple[int, ...]  # first-forward tokens of each DP rank
    drafts: tuple[bool, ...]  # whether each DP rank drafts (propose) or keeps step

    @property
    def padded_tokens(self) -> int:
        return max(self.tokens)


def timeout_s() -> float:
    return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))


def agree(
    group: Any,
    dp_rank: int,
    run: int,
    drafts: bool,
    forwards: int,
    tokens: int,
    timeout: float | None = None,
) -> Agreement:
    """One ``all_gather`` on ``group`` (gloo); the checks above; raises on disagreement."""
    world = dist.get_world_size(group)
    mine = torch.tensor([MAGIC, run, int(drafts), forwards, tokens], dtype=torch.int64)
    table = [torch.zeros_like(mine) for _ in range(world)]
    limit = timeout_s() if timeout is None else timeout
    work = dist.all_gather(table, mine, group=group, async_op=True)
    try:
        work.wait(timeout=datetime.timedelta(seconds=limit))
    except RuntimeError as e:
        raise DPAgreementError(
            f"vllm-ppspec: DP rank {dp_rank}: no drafter-run agreement from the other DP "
            f"ranks within {limit:.0f} s (drafter run {run}); a DP rank skipped its drafter "
            f"run or stopped. ({e})"
        ) from e
    rows = [tuple(int(v) for v in t.tolist()) for t in table]
    problems = []
    if any(r[0] != MAGIC for r in rows):
        problems.append("a rank sent a record that is not a drafter-run agreement")
    if len({r[1] for r in rows}) != 1:
        problems.append("drafter run counts differ (a rank missed or added a drafter run)")
    if len({r[3] for r in rows}) != 1:
        problems.append("numbers of drafter forwards differ")
    if problems:
        table_text = ", ".join(
            f"DP rank {i}: " + " ".join(f"{k}={v}" for k, v in zip(FIELDS[1:], r[1:], strict=True))
            for i, r in enumerate(rows)
        )
        raise DPAgreementError(
            f"vllm-ppspec: DP ranks disagree on a drafter run: {'; '.join(problems)}. "
            f"[{table_text}]. Every DP rank raises this."
        )
    return Agreement(
        run=rows[0][1],
        forwards=rows[0][3],
        tokens=tuple(r[4] for r in rows),
        drafts=tuple(bool(r[2]) for r in rows),
    )


def check_coordination(agreement: Agreement, num_tokens_across_dp: Any, dp_rank: int) -> None:
    """vLLM's per-rank drafter token counts must cover the agreed ones (every rank)."""
    if num_tokens_across_dp is None:
        return
    got = [int(v) for v in num_tokens_across_dp.tolist()]
    if len(got) != len(agreement.tokens) or any(
        g < t for g, t in zip(got, agreement.tokens, strict=False)
    ):
        raise DPAgreementError(
            f"vllm-ppspec: DP rank {dp_rank}: vLLM coordinated drafter tokens {got} across DP, "
            f"the ranks agreed on {list(agreement.tokens)}."
        )
