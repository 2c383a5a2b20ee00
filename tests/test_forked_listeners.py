"""A forked engine core or worker of the tests' fork server starts without the
unconnected TCP sockets it inherited (fixtures/forkserver.py,
``_close_inherited_listeners``), as a spawned one does: ``vllm serve``'s HTTP
socket is bound before the engine starts and listens once it is up, and at a
stop vLLM's API server looks up who holds its port and must find only itself (a
worker found as a zombie there wrote psutil's ``ZombieProcess`` traceback).
``test_e2e_serve_faults.py``'s orderly stops count the port's holders."""

from __future__ import annotations

import os
import socket

from vllm_ppspec_tools.fixtures.forkserver import _close_inherited_listeners


def _open_in_child(fds: list[int]) -> list[bool]:
    """Fork; in the child run the helper, then report which of ``fds`` are open."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            _close_inherited_listeners()
            states = []
            for fd in fds:
                try:
                    os.fstat(fd)
                    states.append("1")
                except OSError:
                    states.append("0")
            os.write(write, "".join(states).encode())
        finally:
            os._exit(0)
    os.close(write)
    out = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    return [c == "1" for c in out]


def test_a_forked_process_drops_inherited_tcp_listeners_and_keeps_other_sockets():
    listener = socket.create_server(("127.0.0.1", 0))
    listener6 = socket.socket(socket.AF_INET6)
    listener6.bind(("::1", 0))
    listener6.listen()
    bound = socket.socket()  # bound, listening later (vllm serve's HTTP socket)
    bound.bind(("127.0.0.1", 0))
    connected = socket.create_connection(listener.getsockname())
    unix = socket.socket(socket.AF_UNIX)  # zmq's ipc sockets and the like
    unix.bind(f"\0ppspec-forked-listeners-{os.getpid()}")
    unix.listen()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    socks = [listener, listener6, bound, connected, unix, udp]
    try:
        opened = _open_in_child([s.fileno() for s in socks])
        assert opened == [False, False, False, True, True, True], opened
        # The parent keeps its own.
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    finally:
        for s in socks:
            s.close()
