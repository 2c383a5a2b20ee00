"""End a remote message-queue read when its queue is shut down.

vLLM's multiprocessing executor reads each worker's reply from a
``MessageQueue``. A reader on the same host waits in a loop that checks the
queue's ``shutting_down`` flag: when a worker dies, the executor's monitor
calls ``shutdown()``, the wait raises ``RuntimeError("cancelled")``, the step
fails and the engine reports itself dead at once. A reader of a worker on
another host (``--nnodes`` > 1) waits in one ``zmq`` poll for the whole RPC
timeout instead (``MessageQueue.recv``, ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``,
300 s by default): with the last PP rank gone, the API server answers
``/health`` with 200 and the requests hang until that timeout.

:func:`install` wraps ``MessageQueue.dequeue``: a remote reader polls in
slices of :data:`SLICE_S` and raises ``RuntimeError("cancelled")`` as soon as
the queue is shut down, as a local reader does; once a message is there,
vLLM's own ``dequeue`` reads it. Local readers are untouched. The registry's
``engine core`` group: the config patches' ``EngineCore.post_step`` wrapper
installs it in an engine core that runs a plugin scheduler (PP + spec with the
plugin's worker), so it is in the process that runs the executor; whatever
``--nnodes`` says (vLLM keeps it at 1 under Ray, which places workers on
several hosts), since only the readers vLLM made remote (``_is_remote_reader``)
change. In the ``worker`` group the plugin's worker on a headless node installs
it too (:func:`install_on_headless_worker`): that worker reads each call of the
leader's executor remotely, and when its own executor stops it in order
(``runner/health/orderly_stop.py``) the read ends instead of waiting for
vLLM's SIGKILL.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from vllm_ppspec.choice.plan import headless_node

SLICE_S = 0.1
_FLAG = "_vllm_ppspec_cancellable"


def cancellable(original: Any) -> Any:
    @functools.wraps(original)
    def dequeue(self: Any, timeout: float | None = None, indefinite: bool = False) -> Any:
        if not getattr(self, "_is_remote_reader", False):
            return original(self, timeout, indefinite)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.remote_socket.poll(timeout=int(SLICE_S * 1000)):
            if self.shutting_down:
                raise RuntimeError("cancelled")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError
        return original(self, 0.0, indefinite)

    setattr(dequeue, _FLAG, True)
    return dequeue


def install_on_headless_worker(worker: Any) -> None:
    """The ``worker`` group's entry: :func:`install` on a headless node only."""
    if headless_node(worker.vllm_config.parallel_config):
        install()


def install() -> None:
    """Idempotent; called in an engine core running a plugin scheduler and by
    the plugin's worker on a headless node."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    if getattr(MessageQueue.dequeue, _FLAG, False):
        return
    MessageQueue.dequeue = cancellable(MessageQueue.dequeue)  # type: ignore[method-assign]
