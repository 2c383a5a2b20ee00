"""K that follows the load: the plugin fills vLLM's dynamic-K schedule itself.

With ``VLLM_PPSPEC_ADAPTIVE_K=1`` and no ``num_speculative_tokens_per_batch_size``
in the speculative config, the plugin's schedulers (sync and lanes) measure
while they serve, then set vLLM's own schedule, ``Scheduler.dynamic_sd_lookup``
(K by the number of requests in a batch), and log it in the form
``--speculative-config`` takes, so it can be pinned.

* **Measuring.** Per decode batch the scheduler records its requests,
  tokens, K (the drafter's passes after it), and the seconds it took through
  the pipeline: from the later of its scheduling and the previous batch's
  output to its own output (with the pipeline filled, the interval between
  outputs; with one batch, its round trip; idle time never counts). Per
  request it records the drafts scheduled, the K they were proposed with, and
  how many were accepted (counted since the start).
* **Choosing.** Once :data:`BATCHES_ENV` (default 200) decode batches are in,
  and again each time a quarter of that window is new,
  :mod:`vllm_ppspec.adaptive_k.k_model` fits the batch cost over the window and
  moves, for every batch size, the K that runs one step toward the K with the
  most tokens per second, where the fit says the step gains over 2%. The
  schedule is logged where K changed for a batch size the window ran. Until
  the first choice the schedule is the static K; before and after it, one
  batch in ten runs the schedule's K - 1 or K + 1, so the cost of a draft
  pass stays measured. The draws use a fixed seed.

Tokens never change: vLLM verifies drafts, so K only changes how many are
tried (greedy output equals PP=1 without spec at every K, ``K = 0``
included). It is off where vLLM's dynamic K is off: a user's schedule wins,
and with data parallelism vLLM drops dynamic K (ranks would choose
different K), so the plugin keeps the static K there too.
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from typing import Any

from vllm.logger import init_logger

from vllm_ppspec.adaptive_k import STAND_IN_FLAG, k_model
from vllm_ppspec.choice.policy import ADAPTIVE_K_ENV

logger = init_logger("vllm.ppspec")

BATCHES_ENV = "VLLM_PPSPEC_ADAPTIVE_K_BATCHES"
DEFAULT_BATCHES = 200
EXPLORE = 0.1  # share of batches run at the chosen K - 1 or K + 1
REFIT = 0.25  # choose again after this share of the window is new


def start(sched: Any) -> AdaptiveK | None:
    """The adaptive K of a plugin scheduler, or None where it stays off (logged)."""
    from vllm_ppspec.choice.plan import plan_of

    if not plan_of(sched.vllm_config).adaptive_k:
        return None
    spec = sched.vllm_config.speculative_config
    k = int(getattr(sched, "num_spec_tokens", 0) or 0)
    stand_in = spec is not None and getattr(spec, STAND_IN_FLAG, False)
    why_not = None
    if spec is None or k <= 0:
        why_not = "no speculative decoding"
    elif spec.num_speculative_tokens_per_batch_size and not stand_in:
        why_not = "the speculative config gives num_speculative_tokens_per_batch_size, which wins"
    elif stand_in and not spec.num_speculative_tokens_per_batch_size:
        why_not = "vLLM turns dynamic K off with data parallelism (ranks would choose different K)"
    elif not stand_in:
        why_not = "the plugin's config patch did not see this line"
    if why_not is not None:
        logger.warning("vllm-ppspec: %s=1 ignored: %s; K stays %d", ADAPTIVE_K_ENV, why_not, k)
        return None
    batches = int(os.environ.get(BATCHES_ENV, DEFAULT_BATCHES))
    if batches < 1:
        raise ValueError(f"{BATCHES_ENV}={batches}: give a number of batches >= 1")
    max_batch = int(sched.scheduler_config.max_num_seqs)
    logger.info(
        "vllm-ppspec: adaptive K: measuring over windows of %d decode batches (K 0..%d)", batches, k
    )
    return AdaptiveK(k, max_batch, batches)


class AdaptiveK:
    """The measurements and the schedule of one plugin scheduler (engine core)."""

    def __init__(self, k: int, max_batch: int, batches: int) -> None:
        self.k = k
        self.max_batch = max_batch
        self.window = batches
        self.acceptance = k_model.Acceptance(k)
        self.samples: deque[tuple[int, int, int, float]] = deque(maxlen=batches)
        self.new_samples = 0
        self.draw = random.Random(0)
        self.proposed_k: dict[str, int] = {}  # request -> K of its latest batch
        self.in_flight: dict[int, tuple[float, dict[str, tuple[int, int]]]] = {}
        self.last_output = 0.0
        self.schedule: list[list[int]] | None = None
        static = [k] * (max_batch + 1)
        # vLLM's lookup: the schedule's K, its K - 1 and its K + 1 (exploring).
        self.lookups = (static, [k - 1] * (max_batch + 1), static)

    def before_schedule(self, sched: Any) -> None:
        """Set vLLM's lookup for the next batch: the schedule (the static K
        until the first choice), and for one batch in ten (:data:`EXPLORE`)
        its K - 1 or K + 1, so the cost of a draft pass stays measured."""
        if self.draw.random() < EXPLORE:
            sched.dynamic_sd_lookup = self.lookups[self.draw.choice((1, 2))]
        else:
            sched.dynamic_sd_lookup = self.lookups[0]

    def scheduled(self, out: Any) -> None:
        if out.total_num_scheduled_tokens <= 0:
            return
        rounds = {
            req_id: (
                self.proposed_k.get(req_id, 0),
                len(out.scheduled_spec_decode_tokens.get(req_id, ())),
            )
            for req_id in out.num_scheduled_tokens
        }
        for req_id in out.num_scheduled_tokens:
            self.proposed_k[req_id] = int(out.num_spec_tokens_to_schedule)
        self.in_flight[id(out)] = (time.perf_counter(), rounds)

    def after_output(self, sched: Any, out: Any, runner_output: Any) -> None:
        """Record a batch's output; every :data:`REFIT` of the window's new
        batches, choose the schedule again and set vLLM's lookup."""
        if not self.record(out, runner_output):
            return
        if len(self.samples) < self.window or self.new_samples < self.window * REFIT:
            return
        self.new_samples = 0
        self.proposed_k = {r: k for r, k in self.proposed_k.items() if r in sched.requests}
        self.choose()
        sched.dynamic_sd_lookup = self.lookups[0]

    def record(self, out: Any, runner_output: Any) -> bool:
        """Add a batch's rounds to the acceptance, and its cost if it was a
        decode batch; whether it was."""
        record = self.in_flight.pop(id(out), None)
        now = time.perf_counter()
        seconds = now - max(record[0], self.last_output) if record else 0.0
        self.last_output = now
        if record is None:
            return False
        decode_only = True
        index = runner_output.req_id_to_index if runner_output is not None else {}
        for req_id, (proposed, drafts) in record[1].items():
            if out.num_scheduled_tokens[req_id] != 1 + drafts:
                decode_only = False  # a prefill chunk
                continue
            row = index.get(req_id)
            sampled = runner_output.sampled_token_ids[row] if row is not None else []
            if len(sampled) > 0:
                self.acceptance.add(proposed, drafts, len(sampled) - 1)
        if decode_only:
            batch = (
                len(out.num_scheduled_tokens),
                int(out.total_num_scheduled_tokens),
                int(out.num_spec_tokens_to_schedule),
                seconds,
            )
            self.samples.append(batch)
            self.new_samples += 1
        return decode_only

    def choose(self) -> None:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        cost = k_model.fit_cost(list(self.samples))
        running = self.lookups[0]
        per_size = [
            k_model.step_toward(cost, self.acceptance, size, running[size])
            for size in range(1, self.max_batch + 1)
        ]
        schedule = k_model.schedule_ranges(per_size)
        chosen = list(build_dynamic_sd_schedule_lookup(schedule, self.max_batch, self.k))
        before = self.lookups[0] if self.schedule is not None else None
        self.lookups = (
            chosen,
            [max(0, k - 1) for k in chosen],
            [min(self.k, k + 1) for k in chosen],
        )
        self.schedule = schedule
        # Logged where K changed for a batch size this window ran; a change
        # at sizes not seen lately (the fit's extrapolation) only at debug.
        seen = {size for size, *_ in self.samples}
        if before is not None and all(before[b] == chosen[b] for b in seen):
            logger.debug("vllm-ppspec: adaptive K: %s", schedule)
            return
        rates = ", ".join(
            f"{self.acceptance.rate(self.acceptance.accepted, i):.2f}" for i in range(self.k)
        )
        logger.info(
            "vllm-ppspec: adaptive K: num_speculative_tokens_per_batch_size=%s "
            "(batch sizes run lately: %s; from the latest %d batches: %.2f ms a batch + %.3f ms "
            "a token + %.2f ms a draft "
            "pass + %.3f ms a request; acceptance by position %s)",
            self.schedule,
            f"{min(seen)}-{max(seen)}",
            len(self.samples),
            cost.base * 1e3,
            cost.per_token * 1e3,
            cost.per_pass * 1e3,
            cost.per_request * 1e3,
            rates,
        )
