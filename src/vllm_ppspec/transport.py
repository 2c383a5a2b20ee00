"""Ship one speculative round from the last PP rank to the other PP ranks.

Pure ``torch.distributed`` on a gloo (CPU) process group; it knows nothing of
vLLM's runner, so it is tested with two plain processes.

Protocol, called by every rank of the PP group, in this order, every round:

1. ``all_reduce(MAX)`` of a 5-int header: each rank contributes its row count
   (the sender: the rows of its sampled matrix; a receiver: its own
   ``input_batch.num_reqs``), the row count negated, the sender's error flag,
   and ``k`` and ``-k``. Afterwards every rank knows the minimum and maximum
   row count and ``k`` of all ranks and whether the sender found its own input
   inconsistent. If anything disagrees, every rank raises
   :class:`RoundDivergenceError` right here and no further collective of this
   round is issued by anyone: nobody hangs.
2. ``broadcast`` from the last rank of one ``[rows, 2k+1]`` int32 tensor: the
   ``[rows, k+1]`` sampled matrix (``-1`` padded) and the ``[rows, k]`` draft
   ids side by side.

Two rendezvous per round, not one: the payload's size depends on the row
count, and a collective must not be issued before every rank knows that all
agree on it (a static-size all-reduce could carry both, but only with sizes
fixed in advance for every rank).

Why gloo: on CUDA, the PP ``device_group`` (NCCL) is the communicator the
pipeline's send/recv use; a broadcast issued there interleaves with in-flight
``isend``/``irecv`` of another micro-step and deadlocks. The payload is a few
dozen integers, so a CPU rendezvous costs little and has no stream ordering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from vllm_ppspec.accounting import draft_matrix, pad_sampled


class RoundDivergenceError(RuntimeError):
    """PP ranks disagree about the shape of a speculative round."""


@dataclass(frozen=True)
class Round:
    """One round as every PP rank sees it after the exchange (CPU int32)."""

    sampled: torch.Tensor  # [rows, k + 1], -1 padded
    drafts: torch.Tensor  # [rows, k]


def _header(rows: int, k: int, sender_error: bool) -> torch.Tensor:
    return torch.tensor([rows, -rows, int(sender_error), k, -k], dtype=torch.int64)


def _check_header(h: torch.Tensor, sender_rows_note: str) -> None:
    max_rows, min_rows = int(h[0]), -int(h[1])
    sender_error = bool(h[2])
    max_k, min_k = int(h[3]), -int(h[4])
    problems = []
    if sender_error:
        problems.append(sender_rows_note or "the last PP rank's sampled rows differ from its batch")
    if max_rows != min_rows:
        problems.append(f"ranks hold between {min_rows} and {max_rows} requests")
    if max_k != min_k:
        problems.append(f"ranks use num_speculative_tokens between {min_k} and {max_k}")
    if problems:
        raise RoundDivergenceError(
            "pipeline-parallel ranks disagree on the speculative round: "
            + "; ".join(problems)
            + ". Every PP rank must run the same scheduler output; this is a bug "
            "in the engine or the plugin, please report it with the log of every rank."
        )


def send_round(
    group: dist.ProcessGroup,
    src: int,
    num_reqs: int,
    num_spec_tokens: int,
    sampled: torch.Tensor,
    drafts: torch.Tensor | list[list[int]] | None,
) -> Round:
    """Last PP rank: send this round's sampled matrix and drafts.

    ``num_reqs`` is the sender's ``input_batch.num_reqs``; a sampled tensor
    with another row count is reported to every rank (step 1) and raised.
    ``src`` is the sender's global rank.
    """
    rows = int(sampled.shape[0])
    note = ""
    matrix = draft_ids = None
    if rows != num_reqs:
        note = f"the last PP rank sampled {rows} rows but its input batch holds {num_reqs} requests"
    else:
        # Shape checks happen before the header so that a bad tensor is
        # reported to every rank instead of leaving receivers in a broadcast.
        try:
            matrix = pad_sampled(sampled, num_spec_tokens)
            draft_ids = draft_matrix(drafts, rows, num_spec_tokens)
        except ValueError as e:
            note = f"the last PP rank produced a malformed round: {e}"
    header = _header(rows, num_spec_tokens, sender_error=bool(note))
    dist.all_reduce(header, op=dist.ReduceOp.MAX, group=group)
    _check_header(header, note)
    assert matrix is not None and draft_ids is not None
    payload = torch.cat([matrix, draft_ids.to(torch.int32)], dim=1).contiguous()
    dist.broadcast(payload, src=src, group=group)
    return Round(matrix, draft_ids)


def recv_round(group: dist.ProcessGroup, src: int, num_reqs: int, num_spec_tokens: int) -> Round:
    """Non-last PP rank: receive the round; ``num_reqs`` is this rank's batch size."""
    header = _header(num_reqs, num_spec_tokens, sender_error=False)
    dist.all_reduce(header, op=dist.ReduceOp.MAX, group=group)
    _check_header(header, "")
    payload = torch.empty((num_reqs, 2 * num_spec_tokens + 1), dtype=torch.int32)
    dist.broadcast(payload, src=src, group=group)
    return Round(payload[:, : num_spec_tokens + 1], payload[:, num_spec_tokens + 1 :])
