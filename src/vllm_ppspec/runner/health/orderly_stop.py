"""A worker that vLLM stops in order says goodbye to its PP peers.

vLLM stops a worker in order in two ways, and both end in the worker's
``shutdown()`` (``WorkerProc.worker_main`` in
vllm/v1/executor/multiproc_executor.py): its executor shuts down (it closes the
worker's death pipe; the worker's busy loop ends), or the worker itself gets
SIGTERM. A Ctrl-C reaches every process of the terminal's process group; the
plugin's worker under vLLM's mp executor ignores SIGINT
(:func:`leave_sigint_to_the_executor`), so its executor, which gets the same
Ctrl-C, stops it the first way. :class:`StopsInOrder` sends the goodbye there,
before vLLM's own clean-up (``peer_watch.say_goodbye``). A worker that is killed, or that the
plugin ends (``rank_errors.end_worker``), says nothing: its peers report it gone.

On a headless node (``vllm serve --headless``: ``node_rank_within_dp > 0``
under the mp executor, which runs in that process, the workers its children),
a peer's goodbye from another node sends SIGTERM to that process, as its admin
would (``peer_watch``). vLLM's executor there then closes this worker's death
pipe and waits for it. The worker waits for the leader's next call in a remote
message-queue read that ignores the queue's shutdown, so the plugin's worker
installs ``patches/engine_core/remote_reads.py`` on such a node (the registry's ``worker``
group, :func:`vllm_ppspec.patches.install_group`): the read ends within 0.1 s, the
worker leaves its busy loop as vLLM's own does when stopped, and the executor
logs that every worker exited gracefully.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from vllm_ppspec.choice.plan import headless_node
from vllm_ppspec.runner.health import peer_watch

__all__ = ["StopsInOrder", "headless_node"]


class StopsInOrder:
    """Worker mixin: the node kind for the peer watch, and the goodbye."""

    vllm_config: Any

    def init_device(self) -> None:
        peer_watch.set_headless_node(headless_node(self.vllm_config.parallel_config))
        leave_sigint_to_the_executor()
        super().init_device()  # type: ignore[misc]

    def shutdown(self) -> None:
        peer_watch.say_goodbye()
        runner = getattr(self, "model_runner", None)
        if runner is not None and hasattr(runner, "ppspec_shutdown"):
            runner.ppspec_shutdown()  # the mode's steps (steps.Steps.shutdown)
        super().shutdown()  # type: ignore[misc]


def leave_sigint_to_the_executor() -> bool:
    """A worker process of vLLM's mp executor ignores SIGINT; True if it was one.

    A Ctrl-C reaches every process of the terminal's process group: the
    worker's own handler (``WorkerProc.worker_main``'s) would end it at once,
    and a worker that exits before its executor began stopping it is logged by
    vLLM as "died unexpectedly". Its executor gets the same Ctrl-C (or its
    process ends) and stops the worker in order through the death pipe, as
    after a SIGTERM to ``vllm serve`` alone. SIGTERM keeps vLLM's handler; a
    worker running inside its engine core's process (one rank) is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    handler = signal.getsignal(signal.SIGINT)
    if "worker_main" not in getattr(handler, "__qualname__", ""):
        return False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return True
