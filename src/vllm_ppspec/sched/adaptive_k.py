"""K that follows the load: the plugin fills vLLM's dynamic-K schedule itself.

With ``VLLM_PPSPEC_ADAPTIVE_K=1`` and no ``num_speculative_tokens_per_batch_size``
in the speculative config, the plugin's schedulers (sync and lanes) measure
while they serve, then set vLLM's own schedule, ``Scheduler.dynamic_sd_lookup``
(K by the number of requests in a batch), and log it in the form
``--speculative-config`` takes, so it can be pinned.

* **Measuring**, for the first :data:`BATCHES_ENV` (default 200) decode
  batches: each batch's K (the drafts proposed after it) is drawn from
  ``0..k`` with a fixed seed. Per batch the scheduler records its requests,
  tokens, K, and the seconds it took through the pipeline: from the later of
  its scheduling and the previous batch's output to its own output (with the
  pipeline filled, the interval between outputs; with one batch, its round
  trip; idle time never counts). Per request it records the drafts scheduled,
  the K they were proposed with, and how many were accepted.
* **Then** :mod:`vllm_ppspec.sched.k_model` fits the batch cost and picks, for
  every batch size, the K with the most tokens per second. The schedule is
  kept until the engine stops.

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
from typing import Any

from vllm.logger import init_logger

from vllm_ppspec.sched import k_model

logger = init_logger("vllm.ppspec")

ADAPTIVE_ENV = "VLLM_PPSPEC_ADAPTIVE_K"
BATCHES_ENV = "VLLM_PPSPEC_ADAPTIVE_K_BATCHES"
DEFAULT_BATCHES = 200
STAND_IN_FLAG = "ppspec_adaptive_k_stand_in"


def mark_config(vllm_config: Any, plugin_acts: bool) -> None:
    """Before vLLM's ``VllmConfig.__post_init__``, on a line the plugin serves:
    stand a schedule of the static K in for the one the scheduler will measure.

    vLLM then treats the line as dynamic K everywhere it must know it (CUDA
    graphs captured piecewise on the V1 runner, no padded decode batches, the
    schedule dropped with data parallelism), and the plugin's scheduler
    replaces the schedule once measured. A user's schedule is left alone."""
    spec = vllm_config.speculative_config
    if os.environ.get(ADAPTIVE_ENV) != "1" or not plugin_acts or spec is None:
        return
    if spec.num_speculative_tokens_per_batch_size or not spec.num_speculative_tokens:
        return
    spec.num_speculative_tokens_per_batch_size = [(1, 1, int(spec.num_speculative_tokens))]
    setattr(spec, STAND_IN_FLAG, True)


def start(sched: Any) -> AdaptiveK | None:
    """The adaptive K of a plugin scheduler, or None where it stays off (logged)."""
    if os.environ.get(ADAPTIVE_ENV) != "1":
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
        logger.warning("vllm-ppspec: %s=1 ignored: %s; K stays %d", ADAPTIVE_ENV, why_not, k)
        return None
    batches = int(os.environ.get(BATCHES_ENV, DEFAULT_BATCHES))
    if batches < 1:
        raise ValueError(f"{BATCHES_ENV}={batches}: give a number of batches >= 1")
    max_batch = int(sched.scheduler_config.max_num_seqs)
    logger.info(
        "vllm-ppspec: adaptive K: measuring over the first %d decode batches (K 0..%d)", batches, k
    )
    return AdaptiveK(k, max_batch, batches)


class AdaptiveK:
    def __init__(self, k: int, max_batch: int, batches: int) -> None:
        self.k = k
        self.max_batch = max_batch
        self.wanted = batches
        self.acceptance = k_model.Acceptance(k)
        self.samples: list[tuple[int, int, int, float]] = []
        self.explore = random.Random(0)
        self.proposed_k: dict[str, int] = {}  # request -> K of its latest batch
        self.in_flight: dict[int, tuple[float, dict[str, tuple[int, int]]]] = {}
        self.last_output = 0.0
        self.schedule: list[list[int]] | None = None

    @property
    def measuring(self) -> bool:
        return self.schedule is None

    def before_schedule(self, sched: Any) -> None:
        """While measuring: vLLM's lookup gives the next batch a drawn K."""
        if self.measuring:
            sched.dynamic_sd_lookup = [self.explore.randint(0, self.k)] * (self.max_batch + 1)

    def after_output(self, sched: Any, out: Any, runner_output: Any) -> None:
        """Record a batch's output; set vLLM's lookup once the schedule is chosen."""
        lookup = self.processed(out, runner_output)
        if lookup is not None:
            sched.dynamic_sd_lookup = lookup

    def scheduled(self, out: Any) -> None:
        if out.total_num_scheduled_tokens <= 0 or not self.measuring:
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

    def processed(self, out: Any, runner_output: Any) -> list[int] | None:
        """Record a batch's output; the dense lookup (index: batch size) once
        the schedule is chosen."""
        record = self.in_flight.pop(id(out), None)
        now = time.perf_counter()
        seconds = now - max(record[0], self.last_output) if record else 0.0
        self.last_output = now
        if record is None or not self.measuring:
            return None
        decode_only = True
        index = runner_output.req_id_to_index if runner_output is not None else {}
        for req_id, (proposed, drafts) in record[1].items():
            if out.num_scheduled_tokens[req_id] != 1 + drafts:
                decode_only = False
                continue
            row = index.get(req_id)
            sampled = runner_output.sampled_token_ids[row] if row is not None else []
            if len(sampled) > 0:
                self.acceptance.add(proposed, drafts, len(sampled) - 1)
        if decode_only:
            self.samples.append(
                (
                    len(out.num_scheduled_tokens),
                    int(out.total_num_scheduled_tokens),
                    int(out.num_spec_tokens_to_schedule),
                    seconds,
                )
            )
        if len(self.samples) < self.wanted:
            return None
        return self._choose()

    def _choose(self) -> list[int]:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        cost = k_model.fit_cost(self.samples)
        per_size = [
            k_model.best_k(cost, self.acceptance, size) for size in range(1, self.max_batch + 1)
        ]
        self.schedule = k_model.schedule_ranges(per_size)
        self.proposed_k.clear()
        self.in_flight.clear()
        rates = ", ".join(
            f"{self.acceptance.rate(self.acceptance.accepted, i):.2f}" for i in range(self.k)
        )
        logger.info(
            "vllm-ppspec: adaptive K: num_speculative_tokens_per_batch_size=%s "
            "(from %d batches: %.2f ms a batch + %.3f ms a token + %.2f ms a draft pass "
            "+ %.3f ms a request; acceptance by position %s)",
            self.schedule,
            len(self.samples),
            cost.base * 1e3,
            cost.per_token * 1e3,
            cost.per_pass * 1e3,
            cost.per_request * 1e3,
            rates,
        )
        return list(build_dynamic_sd_schedule_lookup(self.schedule, self.max_batch, self.k))
