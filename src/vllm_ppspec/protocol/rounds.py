"""Ship one speculative round from the last PP rank to the other PP ranks.

Pure ``torch.distributed`` on a gloo (CPU) process group; it knows nothing of
vLLM's runner, so it is tested with two plain processes.

One message per round, one way. A :class:`RoundChannel` has a static message
size, ``5 + capacity * (2k+1)`` int32 (``capacity`` = the scheduler's
``max_num_seqs``): a header and the payload. The last rank sends it to every
other rank of the PP group (one gloo ``isend`` per receiver, tag
:data:`ROUND_TAG`); every other rank receives it (``irecv`` from the last
rank, same tag), once per round, rounds in the same order on every rank:

- the header: the sender's row count (the rows of its sampled matrix), its
  error flag (its own input was inconsistent), ``k``, and the wall clock at
  which it sent the round (microseconds, two int32 words);
- the payload: the ``[rows, k+1]`` sampled matrix (``-1`` padded) and the
  ``[rows, k]`` draft ids side by side in the first ``rows`` rows.

Who raises :class:`RoundDivergenceError`:

- the sender's own error (or more rows than ``max_num_seqs``) travels in the
  header: every rank raises, after the same message (``every_rank=True``);
- a receiver whose own batch holds another number of requests than the round,
  or another ``k``, raises alone (``every_rank=False``): the sender cannot
  know. Its worker then ends (:mod:`vllm_ppspec.runner.health.rank_errors`) and the
  engine with it, so nobody waits for it.

The size must be equal on every rank before any round, so a channel starts
with one blocking ``all_reduce(MAX)`` of ``[capacity, -capacity, k, -k]``
(every rank, once: :meth:`RoundChannel.agree_shape`, which the runner calls at
start-up; otherwise the first round does): ranks built with different
``max_num_seqs`` or ``num_speculative_tokens`` raise there, on every rank.

Why one way: between hosts, what a round costs is the trips it needs. gloo
sends a message once the receiver has posted its receive, so a receiver
that posts it early (:meth:`RoundChannel.expect`, at the end of the step whose
round it is) gets the round one one-way trip after the sender sent it. An
``all_reduce`` needs both ranks' data both ways: about three one-way trips
after the sender joined, even with the receiver's side posted early. vLLM #44697
reports ~25 ms of fixed cost per
speculative round on slow links. A static size keeps it one message (a
header, then a payload sized by it, would be two).

Why gloo: on CUDA, the PP ``device_group`` (NCCL) is the communicator the
pipeline's send/recv use; a round issued there interleaves with in-flight
``isend``/``irecv`` of another micro-step and deadlocks. The payload is a few
thousand integers, so a CPU message costs little and has no stream ordering.
vLLM's own point-to-point messages on the ``cpu_group`` use tag 0; rounds use
their own tag, so the two never match each other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vllm_ppspec.protocol.accounting import draft_matrix, pad_sampled

ROUND_TAG = 0x5053  # "PS"; vLLM's point-to-point messages use tag 0
HEADER = 5
_LOW = (1 << 31) - 1


class RoundDivergenceError(RuntimeError):
    """PP ranks disagree about the shape of a speculative round.

    ``every_rank``: every rank of the PP group raises it for the same round
    (the sender found it); otherwise only this rank does.
    """

    def __init__(self, message: str, every_rank: bool = True) -> None:
        super().__init__(message)
        self.every_rank = every_rank


@dataclass(frozen=True)
class Round:
    """One round as every PP rank sees it after the exchange (CPU int32)."""

    sampled: torch.Tensor  # [rows, k + 1], -1 padded
    drafts: torch.Tensor  # [rows, k]
    # Receivers: seconds this rank waited for the round after it was sent
    # (sender's wall clock against this rank's: exact on one machine).
    travel_wait_s: float = 0.0


def _header(rows: int, k: int, sender_error: bool) -> torch.Tensor:
    sent_us = time.time_ns() // 1000
    return torch.tensor(
        [rows, int(sender_error), k, sent_us >> 31, sent_us & _LOW], dtype=torch.int32
    )


def _sent_at(header: torch.Tensor) -> float:
    return ((int(header[3]) << 31) | int(header[4])) / 1e6


def _divergence(problems: list[str], every_rank: bool) -> RoundDivergenceError:
    return RoundDivergenceError(
        "pipeline-parallel ranks disagree on the speculative round: "
        + "; ".join(problems)
        + ". Every PP rank must run the same scheduler output; this is a bug "
        "in the engine or the plugin, please report it with the log of every rank.",
        every_rank=every_rank,
    )


def _check_sender(header: torch.Tensor, note: str, capacity: int) -> None:
    """Every rank: what the sender found (in the header it sent)."""
    rows, sender_error = int(header[0]), bool(header[1])
    problems = []
    if sender_error:
        problems.append(note or "the last PP rank's sampled rows differ from its batch")
    if rows > capacity:
        problems.append(f"a rank holds {rows} requests, more than max_num_seqs={capacity}")
    if problems:
        raise _divergence(problems, every_rank=True)


def _check_receiver(header: torch.Tensor, num_reqs: int, k: int) -> None:
    """A receiver: the round against its own batch."""
    rows, sent_k = int(header[0]), int(header[2])
    problems = []
    if rows != num_reqs:
        problems.append(
            f"ranks hold between {min(rows, num_reqs)} and {max(rows, num_reqs)} requests "
            f"(the last PP rank's round has {rows} rows, this rank's step {num_reqs})"
        )
    if sent_k != k:
        problems.append(
            f"ranks use num_speculative_tokens between {min(k, sent_k)} and {max(k, sent_k)}"
        )
    if problems:
        raise _divergence(problems, every_rank=False)


class PostedRound:
    """A round posted without waiting (the last rank's :meth:`RoundChannel.post`, a
    receiver's :meth:`RoundChannel.expect`); :meth:`wait` completes it."""

    def __init__(
        self,
        channel: RoundChannel,
        message: torch.Tensor,
        works: list[object],
        note: str,
        local: Round | None,
        num_reqs: int | None,
    ) -> None:
        self.channel, self.message, self.works, self.note = channel, message, works, note
        self.local = local  # what was sent (None if the sender's input was malformed)
        self.num_reqs = num_reqs  # receivers: this rank's batch size for the round

    def wait(self) -> Round:
        start = time.time()
        for work in self.works:
            work.wait()  # type: ignore[attr-defined]
        header = self.message[:HEADER]
        _check_sender(header, self.note, self.channel.capacity)
        if self.num_reqs is None:  # the sender
            return self.channel._round(self.message, 0.0)
        _check_receiver(header, self.num_reqs, self.channel.k)
        travel = max(0.0, time.time() - max(start, _sent_at(header)))
        return self.channel._round(self.message, travel)


class RoundChannel:
    """The round messages of one PP group, last rank to the others (module docstring).

    ``src`` is the last rank's global rank; ``capacity`` the most requests a
    batch holds (``max_num_seqs``); ``k`` is ``num_speculative_tokens``.
    """

    def __init__(self, group: dist.ProcessGroup, src: int, capacity: int, k: int) -> None:
        self.group, self.src, self.capacity, self.k = group, src, capacity, k
        self.width = 2 * k + 1
        self.receivers = [r for r in dist.get_process_group_ranks(group) if r != src]
        self._agreed = False

    def agree_shape(self) -> None:
        """Once, on every rank, before the first round: equal message sizes.

        Blocking. The runner calls it at start-up, where every PP rank builds
        its channel; left to the first round, at DP > 1 the engine runs a
        blocking dummy batch on every rank in between: a deadlock
        (docs/design.md, "Lanes at DP > 1").
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

    def _empty(self) -> torch.Tensor:
        if not self._agreed:
            self.agree_shape()
        return torch.zeros(HEADER + self.capacity * self.width, dtype=torch.int32)

    def _round(self, message: torch.Tensor, travel_wait_s: float) -> Round:
        rows = min(int(message[0]), self.capacity)
        payload = message[HEADER : HEADER + rows * self.width].view(rows, self.width)
        return Round(payload[:, : self.k + 1], payload[:, self.k + 1 :], travel_wait_s)

    def post(
        self,
        num_reqs: int,
        sampled: torch.Tensor,
        drafts: torch.Tensor | list[list[int]] | None,
    ) -> PostedRound:
        """Last PP rank: send this round to every other rank without waiting.

        ``num_reqs`` is the sender's ``input_batch.num_reqs``; a sampled tensor
        with another row count is reported to every rank and raised (by
        :meth:`PostedRound.wait` here). Rounds arrive in the order posted.
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
            # Shape checks happen before sending so that a bad tensor is
            # reported to every rank by the same message.
            try:
                local = Round(pad_sampled(sampled, self.k), draft_matrix(drafts, rows, self.k))
                payload = torch.cat([local.sampled, local.drafts], dim=1)
            except ValueError as e:
                note = f"the last PP rank produced a malformed round: {e}"
        message = self._empty()
        message[:HEADER] = _header(rows, self.k, bool(note))
        if payload is not None:
            message[HEADER : HEADER + payload.numel()] = payload.reshape(-1)
        works = [
            dist.isend(message, dst, group=self.group, tag=ROUND_TAG) for dst in self.receivers
        ]
        return PostedRound(self, message, list(works), note, local, None)

    def expect(self, num_reqs: int) -> PostedRound:
        """Non-last PP rank: post the receive of the next round now, without
        waiting; :meth:`PostedRound.wait` completes it when the round is needed.

        ``num_reqs`` is this rank's batch size for the step whose round it is,
        known as soon as that step ran. Posted that early, the round is sent
        the moment the last rank has it and arrives while this rank computes
        its next steps: one one-way trip, and no wait if it is there by the
        time it is needed. Posted only when needed, gloo would send it after the
        receive is posted: a round trip more.
        """
        message = self._empty()
        work = dist.irecv(message, self.src, group=self.group, tag=ROUND_TAG)
        return PostedRound(self, message, [work], "", None, num_reqs)
