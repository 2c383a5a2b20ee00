"""An error on a rank vLLM does not read replies from ends the engine.

vLLM's mp executor sends each ``execute_model`` / ``sample_tokens`` call to
every worker but reads the reply of one rank only (the last PP stage's first
TP rank). An exception on another rank is logged there and dropped
(``WorkerProc._execute_worker_rpc`` in vllm/v1/executor/multiproc_executor.py),
and the engine carries on: under PP + speculative decoding that means a round
whose state was not applied on that rank, and wrong tokens later.

With the plugin active, such a rank logs the error and ends its process; vLLM's
worker monitor (``MultiprocExecutor.start_worker_monitor``) then shuts the
executor down and the engine fails (requests get an error, ``/health`` stops
answering 200). A round divergence that every rank raises for the same round
(``RoundDivergenceError.every_rank``: the sender found it) is left to the
output rank, which reports it with its message; one that only a receiver sees
ends that receiver like any other error.

A PP peer that dies (killed, out of memory, its host gone) leaves the other
ranks blocked in a pipeline receive that never returns:
:mod:`vllm_ppspec.runner.health.peer_watch` ends a worker as soon as one of its PP
peers is gone, through :func:`end_worker`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.logger import init_logger

from vllm_ppspec.choice.plan import OFF
from vllm_ppspec.protocol.rounds import RoundDivergenceError

# Under vLLM's "vllm" logger: its handler labels the line ERROR, with the
# process and the traceback (a "vllm_ppspec..." logger has no handler, and
# Python's last-resort one printed the bare message).
logger = init_logger("vllm.ppspec")
EXIT_CODE = 70  # EX_SOFTWARE


class MissingRowsError(RuntimeError):
    """A non-last PP rank reached ``sample_tokens`` without what its
    ``execute_model`` left for it (lanes: the step's rows)."""

    @classmethod
    def on_rank(cls, rank: int, what: str) -> MissingRowsError:
        return cls(
            f"PP rank {rank}: sample_tokens was called without {what}; this rank "
            "cannot apply the speculative rounds the last rank sends."
        )


def is_output_rank() -> bool:
    """The rank whose replies vLLM's executor reads: last PP stage, first TP rank."""
    return get_pp_group().is_last_rank and get_tp_group().rank_in_group == 0


def end_worker(error: BaseException, what: str) -> None:
    """Log ``what`` happened and end this process (vLLM's monitor sees it die)."""
    logger.error(
        "vllm-ppspec: %s on PP rank %d: ending this worker so that vLLM stops the "
        "engine. Error: %r",
        what,
        get_pp_group().rank_in_group,
        error,
        exc_info=error,
    )
    for handler in logging.getLogger("vllm").handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_CODE)


class RankErrorsEndEngine:
    """Worker mixin: ``execute_model`` and ``sample_tokens`` under the rule above."""

    model_runner: Any

    def _ppspec_guarded(self, call: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raised_everywhere = isinstance(e, RoundDivergenceError) and e.every_rank
            active = getattr(self.model_runner, "ppspec_plan", OFF).serves_pp
            if active and not raised_everywhere and not is_output_rank():
                end_worker(e, f"{call} failed on a rank whose replies vLLM does not read")
            raise

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        return self._ppspec_guarded(
            "execute_model",
            super().execute_model,  # type: ignore[misc]
            *args,
            **kwargs,
        )

    def sample_tokens(self, *args: Any, **kwargs: Any) -> Any:
        return self._ppspec_guarded(
            "sample_tokens",
            super().sample_tokens,  # type: ignore[misc]
            *args,
            **kwargs,
        )
