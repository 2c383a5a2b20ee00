"""External-launcher mode: every rank's engine takes the last rank's sampled tokens and drafts.

With ``--distributed-executor-backend external_launcher`` (torchrun: one
process and one engine per rank) vLLM's V1 runner broadcasts the last
stage's logits and every rank samples from them (``broadcast_pp_output``).
Under speculative decoding only the last rank holds the drafter (and the
draft probabilities its rejection sampling reads), and each rank's own
scheduler needs the drafts. So once per ``sample_tokens``, every PP rank, in
step order, one ``broadcast`` from the last rank on the PP group's gloo
``cpu_group`` (:mod:`vllm_ppspec.protocol.external_round`: a static
``[capacity + 1, 2k + 1]`` int32 matrix): the last rank sends, after it
sampled and drafted (:class:`SendRound`); each other rank receives it where
its own sampler would return, takes its sampled tokens in place of its own,
skips its (absent) drafter and holds the drafts for its scheduler
(:class:`ExternalReceiverSteps`). Every rank's engine schedules the same
steps: the same requests reach each, and the scheduler is deterministic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from vllm_ppspec.protocol.external_round import round_shape, unpack_round
from vllm_ppspec.runner.steps.base import ActiveSteps, Part, StepState
from vllm_ppspec.runner.view import RunnerView


class RoundBroadcast:
    """The one broadcast of a step's round, from the last PP rank."""

    def __init__(self, cpu_group: Any, src: int, capacity: int, k: int) -> None:
        self.group, self.src, self.capacity, self.k = cpu_group, src, capacity, k

    def send(self, matrix: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(matrix, src=self.src, group=self.group)

    def receive(self) -> torch.Tensor:
        import torch.distributed as dist

        matrix = torch.empty(round_shape(self.capacity, self.k), dtype=torch.int32)
        dist.broadcast(matrix, src=self.src, group=self.group)
        return matrix


class SendRound(Part):
    """Last rank: the step's sampled tokens (``sampled_tensor``) and drafts,
    broadcast at the end of ``sample_tokens``."""

    def __init__(self, channel: RoundBroadcast) -> None:
        self.channel = channel
        self.sampled: torch.Tensor | None = None

    def sampled_tensor(self, output_token_ids: Any) -> None:
        self.sampled = output_token_ids

    def after_sample(self, view: RunnerView, state: StepState, output: Any) -> None:
        from vllm_ppspec.protocol.external_round import pack_round

        sampled, self.sampled = self.sampled, None
        if sampled is None:
            raise RuntimeError("vllm-ppspec: a step sampled nothing on the last PP rank")
        drafts = view.drafts_no_take() if view.num_spec_tokens else []
        self.channel.send(pack_round(sampled, drafts, self.channel.capacity, self.channel.k))


class ExternalReceiverSteps(ActiveSteps):
    """Other ranks: vLLM's sampler output replaced by the last rank's round;
    no drafter runs here, the round's drafts stand for it."""

    def __init__(self, parts: list[Part], channel: RoundBroadcast) -> None:
        from vllm_ppspec.choice.policy import Mode

        super().__init__(Mode.EXTERNAL, parts, hides_drafter=True)
        self.channel = channel
        self.drafts: list[list[int]] | None = None

    def sample(self, vllm_sample: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        """The last rank's tokens for this step. Without drafts in the step vLLM's
        sampler runs first (its logprobs, from the broadcast logits); with drafts
        this rank has no rejection sampler (vLLM builds it on the last rank) and
        the step's logprobs are not computed here."""
        from vllm.v1.outputs import SamplerOutput

        own = vllm_sample(logits, None) if spec_decode_metadata is None else None
        sampled, self.drafts = unpack_round(self.channel.receive(), self.channel.k)
        if own is None:  # a step with drafts: one row per request
            rows = len(spec_decode_metadata.num_draft_tokens)
        else:
            rows = int(own.sampled_token_ids.shape[0])
        if sampled.shape[0] != rows:
            raise RuntimeError(
                f"vllm-ppspec: the last PP rank sampled {sampled.shape[0]} requests this step, "
                f"this rank scheduled {rows}: the ranks' engines diverged"
            )
        width = 1 if spec_decode_metadata is None else spec_decode_metadata.max_spec_len + 1
        tokens = sampled[:, :width].to(device=logits.device)
        if own is not None:
            own.sampled_token_ids = tokens.to(own.sampled_token_ids.dtype)
            return own
        return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)

    @contextlib.contextmanager
    def sampling(self, runner: Any) -> Iterator[None]:
        """While vLLM's ``sample_tokens`` runs here, it sees no speculative
        config (no drafter to run); after it, the round's drafts are this
        rank's drafts, for its scheduler (``take_draft_token_ids``)."""
        saved = runner.speculative_config
        runner.speculative_config = None
        try:
            yield
        finally:
            runner.speculative_config = saved
        drafts, self.drafts = self.drafts, None
        if drafts is not None:
            runner._draft_token_ids = drafts
            runner._draft_token_req_ids = list(runner.input_batch.req_ids)
