"""Ship one speculative round from the last PP rank to the other PP ranks.

Pure ``torch.distributed`` on a gloo (CPU) process group; it knows nothing of
vLLM's runner, so it is tested with two plain processes.

One rendezvous per round. A :class:`RoundChannel` has a static message size,
``5 + capacity * (2k+1)`` int32 (``capacity`` = the scheduler's
``max_num_seqs``), so header and payload travel together in one
``all_reduce(MAX)`` that every rank of the PP group calls, every round, in
this order:

- every rank writes a 5-int header: its row count (the sender: the rows of
  its sampled matrix; a receiver: its own ``input_batch.num_reqs``), the row
  count negated, the sender's error flag, ``k`` and ``-k``;
- the last rank writes its ``[rows, k+1]`` sampled matrix (``-1`` padded) and
  ``[rows, k]`` draft ids side by side into the first ``rows`` rows of the
  payload area; every other payload int, on every rank, is ``INT32_MIN``, so
  the maximum is the sender's payload.

Afterwards every rank holds the minimum and maximum row count and ``k`` of all
ranks, whether the sender found its own input inconsistent, and the round. If
anything disagrees, every rank raises :class:`RoundDivergenceError` after that
same collective: nobody is left waiting, and the group stays usable.

The size must be equal on every rank before any round, so a channel starts
with one blocking ``all_reduce(MAX)`` of ``[capacity, -capacity, k, -k]``
(every rank, once: :meth:`RoundChannel.agree_shape`, which the runner calls at
start-up; otherwise the first round does): ranks built with different
``max_num_seqs`` or ``num_speculative_tokens`` raise there, on every rank.

Why one message of static size: between hosts each collective costs a network
round trip (vLLM #44697 reports ~25 ms of fixed cost per speculative round on
slow links). Two rendezvous (a header, then a payload sized by it) cost two;
the static message costs one, for a few KB more bytes (7 KB at 256 requests,
k=3). ``python -m vllm_ppspec_tools.transport_bench`` measures both.

Why gloo: on CUDA, the PP ``device_group`` (NCCL) is the communicator the
pipeline's send/recv use; a collective issued there interleaves with in-flight
``isend``/``irecv`` of another micro-step and deadlocks. The payload is a few
thousand integers, so a CPU rendezvous costs little and has no stream ordering.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from vllm_ppspec.protocol.accounting import draft_matrix, pad_sampled


class RoundDivergenceError(RuntimeError):
    """PP ranks disagree about the shape of a speculative round."""


@dataclass(frozen=True)
class Round:
    """One round as every PP rank sees it after the exchange (CPU int32)."""

    sampled: torch.Tensor  # [rows, k + 1], -1 padded
    drafts: torch.Tensor  # [rows, k]


HEADER = 5
EMPTY = torch.iinfo(torch.int32).min  # payload filler: loses every MAX


def _header(rows: int, k: int, sender_error: bool) -> torch.Tensor:
    return torch.tensor([rows, -rows, int(sender_error), k, -k], dtype=torch.int32)


def _check_header(h: torch.Tensor, sender_rows_note: str, capacity: int) -> None:
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
    if max_rows > capacity:
        problems.append(f"a rank holds {max_rows} requests, more than max_num_seqs={capacity}")
    if problems:
        raise RoundDivergenceError(
            "pipeline-parallel ranks disagree on the speculative round: "
            + "; ".join(problems)
            + ". Every PP rank must run the same scheduler output; this is a bug "
            "in the engine or the plugin, please report it with the log of every rank."
        )


class PostedRound:
    """A round posted without waiting (the last rank's :meth:`RoundChannel.post`, a
    receiver's :meth:`RoundChannel.expect`); :meth:`wait` completes it."""

    def __init__(
        self,
        channel: RoundChannel,
        message: torch.Tensor,
        work: object,
        note: str,
        local: Round | None,
    ) -> None:
        self.channel, self.message, self.work, self.note = channel, message, work, note
        self.local = local  # what was sent (None if the sender's input was malformed)

    def wait(self) -> Round:
        self.work.wait()  # type: ignore[attr-defined]
        _check_header(self.message[:HEADER], self.note, self.channel.capacity)
        return self.channel._round(self.message)


class RoundChannel:
    """The round exchange of one PP group: one ``all_reduce`` per round (module docstring).

    ``src`` is the last rank's global rank; ``capacity`` the most requests a
    batch holds (``max_num_seqs``); ``k`` is ``num_speculative_tokens``.
    """

    def __init__(self, group: dist.ProcessGroup, src: int, capacity: int, k: int) -> None:
        self.group, self.src, self.capacity, self.k = group, src, capacity, k
        self.width = 2 * k + 1
        self._agreed = False

    def agree_shape(self) -> None:
        """Once, on every rank, before the first round: equal message sizes.

        Blocking. The runner calls it at start-up, where every PP rank builds
        its channel; left to the first round, the last rank's first
        :meth:`post` would wait here until a receiver's first round, PP steps
        later under lanes, and at DP > 1 the engine runs a blocking dummy batch
        on every rank in between: a deadlock (docs/design.md, "Lanes at DP > 1").
        """
        shape = torch.tensor([self.capacity, -self.capacity, self.k, -self.k], dtype=torch.int64)
        dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=self.group)
        caps, ks = (int(shape[0]), -int(shape[1])), (int(shape[2]), -int(shape[3]))
        if caps[0] != caps[1] or ks[0] != ks[1]:
            raise RoundDivergenceError(
                "pipeline-parallel ranks disagree on the speculative round's shape: "
                f"max_num_seqs between {caps[1]} and {caps[0]}, num_speculative_tokens "
                f"between {ks[1]} and {ks[0]}. Every PP rank must be built from the same "
                "engine configuration; this is a bug, please report it with every rank's log."
            )
        self._agreed = True

    def _message(self, header: torch.Tensor, payload: torch.Tensor | None) -> torch.Tensor:
        if not self._agreed:
            self.agree_shape()
        message = torch.full((HEADER + self.capacity * self.width,), EMPTY, dtype=torch.int32)
        message[:HEADER] = header
        if payload is not None:
            message[HEADER : HEADER + payload.numel()] = payload.reshape(-1)
        return message

    def _exchange(self, header: torch.Tensor, payload: torch.Tensor | None) -> torch.Tensor:
        message = self._message(header, payload)
        dist.all_reduce(message, op=dist.ReduceOp.MAX, group=self.group)
        return message

    def _round(self, message: torch.Tensor) -> Round:
        rows = int(message[0])
        payload = message[HEADER : HEADER + rows * self.width].view(rows, self.width)
        return Round(payload[:, : self.k + 1], payload[:, self.k + 1 :])

    def post(
        self,
        num_reqs: int,
        sampled: torch.Tensor,
        drafts: torch.Tensor | list[list[int]] | None,
    ) -> PostedRound:
        """Last PP rank: start this round's exchange without waiting for the others.

        ``num_reqs`` is the sender's ``input_batch.num_reqs``; a sampled tensor
        with another row count is reported to every rank and raised (by
        :meth:`PostedRound.wait` here). Rounds complete in the order posted.
        """
        rows = int(sampled.shape[0])
        note = ""
        payload = None
        local = None
        if rows != num_reqs:
            note = (
                f"the last PP rank sampled {rows} rows but its input batch holds "
                f"{num_reqs} requests"
            )
        elif rows <= self.capacity:
            # Shape checks happen before the exchange so that a bad tensor is
            # reported to every rank by the same collective.
            try:
                local = Round(pad_sampled(sampled, self.k), draft_matrix(drafts, rows, self.k))
                payload = torch.cat([local.sampled, local.drafts], dim=1)
            except ValueError as e:
                note = f"the last PP rank produced a malformed round: {e}"
        message = self._message(_header(rows, self.k, bool(note)), payload)
        work = dist.all_reduce(message, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return PostedRound(self, message, work, note, local)

    def send(
        self,
        num_reqs: int,
        sampled: torch.Tensor,
        drafts: torch.Tensor | list[list[int]] | None,
    ) -> Round:
        """Last PP rank: send this round and wait until every rank has it."""
        return self.post(num_reqs, sampled, drafts).wait()

    def expect(self, num_reqs: int) -> PostedRound:
        """Non-last PP rank: post this rank's side of the next round now, without
        waiting; :meth:`PostedRound.wait` completes it when the round is needed.

        ``num_reqs`` is this rank's batch size for the step whose round it is,
        known as soon as that step ran. Posted that early, the exchange runs
        in the background while this rank computes its next steps: a round
        that has arrived by the time it is needed costs no wait (across hosts
        gloo's all-reduce needs about two round trips after both sides have
        posted; posting at receive time paid them at every step). Same
        collective, same order, same checks as :meth:`recv`.
        """
        message = self._message(_header(num_reqs, self.k, sender_error=False), None)
        work = dist.all_reduce(message, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return PostedRound(self, message, work, "", None)

    def recv(self, num_reqs: int) -> Round:
        """Non-last PP rank: receive the round; ``num_reqs`` is this rank's batch size."""
        message = self._exchange(_header(num_reqs, self.k, sender_error=False), None)
        _check_header(message[:HEADER], "", self.capacity)
        return self._round(message)
