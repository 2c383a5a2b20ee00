"""A remote message-queue read ends when its queue is shut down
(``patches/engine_core/remote_reads.py``), and otherwise reads as vLLM's own does."""

from __future__ import annotations

import pickle
import threading
import time
from types import SimpleNamespace

import pytest
import zmq

from vllm_ppspec.patches.engine_core.remote_reads import cancellable


def _reader():
    """A stand-in for a remote MessageQueue reader, on a zmq PAIR."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    ctx = zmq.Context.instance()
    writer, reader = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = writer.bind_to_random_port("tcp://127.0.0.1")
    reader.connect(f"tcp://127.0.0.1:{port}")
    queue = SimpleNamespace(
        _is_local_reader=False, _is_remote_reader=True, remote_socket=reader, shutting_down=False
    )
    return queue, writer, cancellable(MessageQueue.dequeue)


def test_a_waiting_remote_read_ends_soon_after_shutdown():
    queue, _, dequeue = _reader()
    threading.Timer(0.5, lambda: setattr(queue, "shutting_down", True)).start()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="cancelled"):
        dequeue(queue, timeout=300.0)  # vLLM's own waits the whole 300 s
    assert time.monotonic() - start < 1.0


def test_a_remote_read_returns_the_message_and_keeps_its_timeout():
    queue, writer, dequeue = _reader()
    threading.Timer(0.3, lambda: writer.send_multipart([pickle.dumps(("ok", 7))])).start()
    assert dequeue(queue, timeout=10.0) == ("ok", 7)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        dequeue(queue, timeout=0.4)
    assert 0.3 < time.monotonic() - start < 1.0


def test_local_readers_are_left_to_vllm():
    calls = []
    dequeue = cancellable(lambda self, timeout=None, indefinite=False: calls.append(timeout))
    dequeue(SimpleNamespace(_is_remote_reader=False), 5.0)
    assert calls == [5.0]
