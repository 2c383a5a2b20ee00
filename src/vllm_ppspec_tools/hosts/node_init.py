"""A "host" (``two_hosts``), run as a job of the caller's fork server.

``main(netns, hostname, own_shm, socket_path)``, in a child of the caller's
fork server (vLLM imported already):

1. enters the host's network namespace (``setns``, as ``ip netns exec``:
   ``/sys`` then shows that namespace's interfaces), and makes its own
   mount, UTS and pid namespaces (``unshare``, as ``unshare --pid --fork
   --mount-proc --uts --mount``): every mount private, the hostname set,
   ``/dev/shm`` a tmpfs of its own unless ``own_shm`` is ``0``;
2. forks process 1 of the new pid namespace, which mounts that namespace's
   ``/proc``, forks the host's fork server, and reaps every process of the
   namespace that ends (orphans come to process 1);
3. the host's fork server accepts one connection on ``socket_path`` and serves
   the fork server's protocol on it (``forkserver.serve``): it is a fork of a
   process that has imported vLLM, so a host starts in well under a second
   instead of importing vLLM again (about 10 s of CPU per host here).

When the connection closes the fork server ends, process 1 exits, and the
kernel kills every process left in the namespace: the host is gone. SIGTERM
or SIGKILL to process 1 (``Node.kill_host``) does the same. The job itself
waits for process 1 and exits with it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_PRIVATE = 0x4000, 1 << 18
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def enter_host(netns: str, hostname: str, own_shm: bool) -> None:
    """Join ``netns`` and make this process's own mount, UTS and pid namespaces
    (the pid namespace holds this process's next child, not itself)."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _check(_libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    finally:
        os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    _check(_libc.umount2(b"/sys", MNT_DETACH), "umount /sys")
    _mount(netns, "/sys", "sysfs", 0, None)
    if own_shm:
        _mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=4g")
    socket.sethostname(hostname)


def _serve_on(path: str) -> None:
    """The host's fork server, on the first connection to ``path``."""
    from vllm_ppspec_tools.fixtures import forkserver

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(1)
    os.rename(path + ".tmp", path)  # the caller connects once the path exists
    conn, _ = listener.accept()
    listener.close()
    os.dup2(conn.fileno(), 0)
    os.dup2(conn.fileno(), 1)
    conn.close()
    forkserver.serve()


def _process_one(path: str) -> None:
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    server = os.fork()
    if server == 0:
        code = 0
        try:
            _serve_on(path)
        except BaseException:
            code = 1
            import traceback

            traceback.print_exc()
        os._exit(code)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        pid, _ = os.wait()
        if pid == server:
            os._exit(0)


def main() -> None:
    netns, hostname, own_shm, path = sys.argv[1:5]
    enter_host(netns, hostname, own_shm == "1")
    init = os.fork()
    if init == 0:
        try:
            _process_one(path)
        finally:
            os._exit(1)
    _, status = os.waitpid(init, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
