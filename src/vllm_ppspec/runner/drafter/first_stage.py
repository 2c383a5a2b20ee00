"""A draft model on the first PP stage, so that the last stage carries only the target's tail.

vLLM runs the drafter after sampling, on the last stage: with a draft model
of its own (``draft_model``) that stage carries the target's last layers, the
LM head and K drafter passes, and sets the pipeline's pace. A draft model needs
only token ids, and under sync scheduling the first stage learns every token
from the scheduler output. Where the plan puts it there (``Plan.drafter_first``:
``VLLM_PPSPEC_DRAFTER_STAGE=first``, or ``auto``, the default, where the
stage-cost model says so: ``choice/drafter_stage.py``) the first stage drafts
at the start of each step instead:

* the last rank proposes placeholders (``0``) for each request, attached to its
  output as the drafts are today (``sched/draft_delivery.py``): the scheduler
  schedules K draft slots as usual (grammar-checked requests get none:
  ``sched/filled.py``);
* in the next step of that request the first rank, after vLLM's
  ``_update_states``, runs the drafter (:class:`DraftCatchUp`; the step parts
  are in ``runner/steps/drafts.py``): one pass
  over the tokens its KV cache lacks (the accepted drafts it did not process,
  at least the token before the last sampled one) plus the last sampled token,
  then K - 1 single-token passes; it writes the drafts into the input batch in
  place of the placeholders, so its own forward runs on them;
* the drafts travel with the step's intermediate tensors (``protocol/draft_tensor.py``),
  rank to rank; each later rank takes them out before vLLM reads the tensors
  and writes them into its input batch the same way, so the last rank's
  rejection sampler verifies them.

Tokens never depend on the drafts (vLLM verifies them), so a draft model that
drafted worse would only accept less. Requests in prefill, or decoding without
draft slots, get one drafter pass with K = 0 over the same tokens, so the
drafter's KV cache keeps up. The drafter drafts greedily (the last rank
verifies as for any draft given without its probabilities: lossless).

No collective beyond vLLM's own send of the intermediate tensors: the drafts
ride in it. Applies to ``draft_model`` (not parallel drafting) under sync
scheduling at DP = 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from vllm_ppspec.choice import policy
from vllm_ppspec.protocol.draft_tensor import with_slots
from vllm_ppspec.runner.view import RunnerView


def write_drafts(view: RunnerView, drafts: dict[str, list[int]], scheduled: dict[str, Any]) -> None:
    """Put each request's drafts where vLLM put its placeholders (after ``_update_states``)."""
    batch = view.input_batch
    for req_id, ids in drafts.items():
        slots = len(scheduled[req_id])
        if len(ids) != slots:
            raise RuntimeError(
                f"vllm-ppspec: {len(ids)} drafts for request {req_id}, it has {slots} draft slots"
            )
        row = batch.req_id_to_index[req_id]
        start = int(batch.num_tokens_no_spec[row])
        batch.token_ids_cpu[row, start : start + slots] = ids
        batch.spec_token_ids[row][:] = ids


class DraftCatchUp:
    """Where the first stage's drafter KV cache stands, per request, and its passes."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.drafter = runner.drafter
        # req_id -> positions below this are in the drafter's KV cache (an upper
        # bound: lowered to the target's computed tokens each step).
        self.valid: dict[str, int] = {}
        # req_id -> (position of the token drafted from, its drafts), last step.
        self.drafted: dict[str, tuple[int, list[int]]] = {}

    def forget(self, req_ids: Any) -> None:
        for r in req_ids:
            self.valid.pop(r, None)
            self.drafted.pop(r, None)

    def restore_accepted(self, req_id: str, row: int, computed: int) -> None:
        """Put back the accepted drafts vLLM overwrote on this rank.

        On a non-last rank vLLM's ``_update_states`` fills the positions from
        the last known token to the new one with the one new token the
        scheduler sends (``new_token_ids``), where the accepted drafts were:
        harmless to the target, whose KV for them is computed, but the drafter
        reads them. The accepted drafts are this rank's own: the first
        ``computed - n - 1`` of those drafted from position ``n``.
        """
        last = self.drafted.pop(req_id, None)
        if last is None:
            return
        n, ids = last
        accepted = computed - n - 1
        if 0 < accepted <= len(ids):
            self.runner.input_batch.token_ids_cpu[row, n + 1 : n + 1 + accepted] = ids[:accepted]

    def fits(self, scheduler_output: Any) -> bool:
        """The step's longest sequence plus K fits the drafter's length limit (the
        draft's own ``max_model_len``, else the target's): where it does not, vLLM
        at PP = 1 runs no drafter for the batch and drafts zeros. Mirrors
        ``GPUModelRunner._input_fits_in_drafter``
        (vllm/v1/worker/gpu_model_runner.py; hash pinned in
        compat.data.MIRRORED_FUNCTIONS) over the seq lens the step's attention
        metadata gives it: computed plus scheduled tokens."""
        batch, runner = self.runner.input_batch, self.runner
        longest = max(
            int(batch.num_computed_tokens_cpu[batch.req_id_to_index[r]]) + n
            for r, n in scheduler_output.num_scheduled_tokens.items()
        )
        return longest + int(runner.num_spec_tokens) <= int(runner.effective_drafter_max_model_len)

    def step(self, scheduler_output: Any) -> dict[str, list[int]]:
        """Run the drafter for this step; the drafts of each request with draft slots
        (zeros for all, and no drafter pass, where the step does not fit: :meth:`fits`)."""
        batch = self.runner.input_batch
        spec = scheduler_output.scheduled_spec_decode_tokens
        fits = self.fits(scheduler_output)
        catch_up: list[tuple[str, int, int]] = []  # (req_id, first, end): positions [first, end)
        drafting: list[tuple[str, int, int]] = []
        drafts: dict[str, list[int]] = {}
        for req_id, count in scheduler_output.num_scheduled_tokens.items():
            row = batch.req_id_to_index[req_id]
            computed = int(batch.num_computed_tokens_cpu[row])
            self.restore_accepted(req_id, row, computed)
            slots = len(spec.get(req_id, ()))
            end = computed + count - slots  # known tokens: positions < end
            # A request first seen here starts where the target starts (a prefix
            # cache hit holds the drafter's KV too, as at PP = 1).
            first = min(self.valid.get(req_id, computed), computed)
            self.valid[req_id] = first
            if not fits or end < 2 or end <= first:
                # No pass: past the drafter's length limit, or nothing before the
                # last token yet (a one-token prompt's first step: it goes in with
                # the next pass). The drafter's cache stays where it is, and a
                # later pass catches up from there. Where the scheduler gave draft
                # slots (a one-token prompt can get them: sched/draft_delivery.py
                # attaches placeholders to every request), zeros, as vLLM drafts
                # where its drafter does not run.
                if slots:
                    drafts[req_id] = [0] * slots
                    self.drafted[req_id] = (end - 1, drafts[req_id])
                continue
            # At least the token before the last one, so the pass has one target token.
            (drafting if slots else catch_up).append((req_id, min(first, end - 2), end))
        if catch_up:
            self._propose(catch_up, 0)
            for req_id, _, end in catch_up:
                self.valid[req_id] = end
        if drafting:
            k = max(len(spec[r]) for r, _, _ in drafting)
            proposed = self._propose(drafting, k)
            for i, (req_id, _, end) in enumerate(drafting):
                slots = len(spec[req_id])
                drafts[req_id] = proposed[i, :slots].tolist()
                # Passes ran over the drafts up to the (k-1)-th: valid where accepted.
                self.valid[req_id] = end - 1 + k
                self.drafted[req_id] = (end - 1, drafts[req_id])
        # In the scheduler's order of draft slots (the receivers decode by it).
        return {r: drafts[r] for r in with_slots(spec)}

    def _propose(self, rows: list[tuple[str, int, int]], k: int) -> torch.Tensor:
        """One drafter call: for each row the tokens [first, end - 1) as the target's,
        the token at end - 1 as the next; ``k`` drafts each (0: the pass only)."""
        from types import SimpleNamespace

        from vllm.v1.attention.backend import CommonAttentionMetadata

        runner, batch = self.runner, self.runner.input_batch
        table = batch.block_table[self.drafter.kv_cache_gid]
        bs = int(table.block_size)
        blocks = table.get_numpy_array()
        token_ids, positions, slots, next_ids, lens, seq_lens, block_rows = (
            [],
            [],
            [],
            [],
            [],
            [],
            [],
        )
        for req_id, first, end in rows:
            row = batch.req_id_to_index[req_id]
            pos = np.arange(first, end - 1, dtype=np.int64)
            token_ids.append(batch.token_ids_cpu[row, first : end - 1].astype(np.int64))
            positions.append(pos)
            slots.append(blocks[row, pos // bs].astype(np.int64) * bs + pos % bs)
            next_ids.append(int(batch.token_ids_cpu[row, end - 1]))
            lens.append(len(pos))
            seq_lens.append(end - 1)
            block_rows.append(row)
        device = runner.device
        qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        cad = CommonAttentionMetadata(
            query_start_loc=torch.from_numpy(qsl).to(device),
            query_start_loc_cpu=torch.from_numpy(qsl),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            num_reqs=len(rows),
            num_actual_tokens=int(qsl[-1]),
            max_query_len=max(lens),
            max_seq_len=max(seq_lens),
            block_table_tensor=torch.from_numpy(blocks[block_rows]).to(device),
            slot_mapping=torch.from_numpy(np.concatenate(slots)).to(device),
            causal=True,
        )
        target_positions = torch.from_numpy(np.concatenate(positions)).to(device)
        drafts = self.drafter.propose(
            k,
            torch.from_numpy(np.concatenate(token_ids)).to(device=device, dtype=torch.int32),
            target_positions,
            None,
            torch.tensor(next_ids, dtype=torch.int32, device=device),
            None,
            cad,
            SimpleNamespace(all_greedy=True),  # greedy drafts (module docstring)
        )
        return drafts.to("cpu")


def set_up(runner: Any, pp: Any) -> DraftCatchUp | bool:
    """Follow the plan's drafter stage (``Plan.drafter_first``, every rank alike).

    Returns False where the drafter stays on the last stage (logged with the
    reason on the first rank), True on the other ranks where it runs on the
    first, and on the first rank its :class:`DraftCatchUp` after building the
    drafter there (loaded by vLLM's ``load_model``, which loads any ``drafter``).
    """
    from vllm.logger import init_logger

    from vllm_ppspec.runner.drafter.scope import isolate_drafter

    logger = init_logger("vllm.ppspec")
    plan = runner.ppspec_plan
    if not plan.drafter_first:
        if plan.drafter_why != policy.STAGE_NOT_ASKED and pp.is_first_rank:
            logger.info("vllm-ppspec: the drafter runs on the last stage: %s", plan.drafter_why)
        return False
    if not pp.is_first_rank:
        return True
    from vllm.v1.spec_decode.draft_model import DraftModelProposer

    runner.drafter = DraftModelProposer(runner.vllm_config, runner.device, runner)
    isolate_drafter(runner.drafter)
    logger.info("vllm-ppspec: the draft model runs on the first PP stage (%s)", plan.drafter_why)
    return DraftCatchUp(runner)


@contextmanager
def drafter_unloaded(runner: Any, unloaded: bool) -> Iterator[None]:
    """While vLLM loads the model, the last rank's drafter is out of its sight when the
    first stage drafts: vLLM loads a ``drafter`` wherever the attribute exists."""
    drafter = runner.__dict__.pop("drafter", None) if unloaded else None
    try:
        yield
    finally:
        if drafter is not None:
            runner.drafter = drafter
