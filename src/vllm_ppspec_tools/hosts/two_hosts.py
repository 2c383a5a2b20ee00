"""Hosts on this machine, for PP across hosts: two (tests/test_e2e_two_hosts.py,
tests/test_e2e_link_faults.py, scripts/bench_two_hosts.py) or more, one PP
rank each (tests/test_e2e_three_hosts.py).

Each host is a network namespace with its own pid namespace, ``/dev/shm``
(or this machine's, shared by all) and hostname (``netns`` makes the
namespaces and the veth pair between two, or the bridge between more;
``delay_line`` a slow link between two; a second veth pair joins the first
host to the root namespace, where the client runs; with ``gloo_link`` a
second network joins the hosts for gloo: ``VLLM_HOST_IP`` on the first,
``GLOO_SOCKET_IFNAME`` naming the second, two addresses per host as on a
machine with a data network). A host is a job of this process's fork
server (``node_init``, :func:`start_host`): it enters the namespaces, and
its process 1 runs the host's own fork server, a fork of one that has
imported vLLM already: every ``vllm serve`` is forked from it, so it runs in
that host's namespaces, with that host's pids.

Pids: the fork server reports the pids of its host's namespace. Signals
from the caller go to the matching pid of the root namespace
(:meth:`Node.root_pid`, from ``NSpid`` in ``/proc/<pid>/status``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_ppspec_tools.fixtures import forkserver, forkserver_relay
from vllm_ppspec_tools.fixtures.server import health, pp_spec_args, serve_args
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec
from vllm_ppspec_tools.hosts.delay_line import delay_link
from vllm_ppspec_tools.hosts.netns import (
    Host,
    _ip,
    bare_hosts,
    bridge_hosts,
    second_network,
    veth_hosts,
)

K = 3  # draft tokens per round (the tests' K, tests/acceptance.py)
MAX_MODEL_LEN = 512
API_PORT = 8000
MASTER_PORT = 29511


def start_host(rank: int, host: Host, gloo: Host | None, shared_shm: bool = False) -> Node:
    """Host ``rank`` (``node_init``, hostname ``ppspec-host<rank>``), forked
    from this process's fork server, and its own fork server's client;
    ``gloo``: its interface on the second network, if any; ``shared_shm``: the
    host keeps this machine's ``/dev/shm`` (as containers with their own
    network and ``--ipc=host``) instead of a tmpfs of its own."""
    hostname = f"ppspec-host{rank}"
    where = Path(tempfile.mkdtemp(prefix=f"ppspec-{hostname}-"))
    path, log = where / "fork.sock", where / "host.log"
    argv = ["node_init", host.netns, hostname, "0" if shared_shm else "1", str(path)]
    job = forkserver.start("vllm_ppspec_tools.hosts.node_init", argv, str(log), dict(os.environ))

    def connect() -> forkserver_relay.SocketServerProc:
        deadline = time.monotonic() + 60
        while not path.exists():
            if job.poll() is not None or time.monotonic() > deadline:
                job.kill()
                raise RuntimeError(f"host {hostname} did not start: {log.read_text()[-3000:]}")
            time.sleep(0.01)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        return forkserver_relay.SocketServerProc(sock)

    server = forkserver.ForkServer(name=f"host {hostname}'s fork server", connect=connect)
    return Node(rank, host, server, launcher=job, home=where, gloo=gloo)


def _pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


@dataclass
class Node:
    rank: int
    host: Host
    server: forkserver.ForkServer
    launcher: Any  # the fork server's job whose child is this host's process 1
    home: Path  # its socket and its log
    jobs: list[Any] = field(default_factory=list)
    gloo: Host | None = None  # the second network's interface (gloo_link), else None

    @property
    def gloo_host(self) -> Host:
        """Where gloo binds (``GLOO_SOCKET_IFNAME``): the second network's
        interface if there is one, else the host's own."""
        return self.gloo or self.host

    def init_pid(self) -> int:
        """Root-namespace pid of this host's process 1 (node_init's child)."""
        return _children(self.launcher.pid)[0]

    def pids(self) -> list[int]:
        """Root-namespace pids of every process in this host's pid namespace."""
        try:
            ns = _pid_ns(self.init_pid())
        except (OSError, IndexError):
            return []
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if _pid_ns(int(entry.name)) == ns:
                        out.append(int(entry.name))
                except OSError:
                    pass
        return out

    def vllm_pids(self) -> list[int]:
        """This host's processes but the harness's own (process 1, the fork server)."""
        try:
            init = self.init_pid()
        except (OSError, IndexError, AssertionError):
            return []
        harness = {init, *_children(init)} if Path(f"/proc/{init}").exists() else {init}
        return [p for p in self.pids() if p not in harness]

    def root_pid(self, ns_pid: int) -> int:
        """The root-namespace pid of this host's process ``ns_pid``."""
        for pid in self.pids():
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            line = next(x for x in status.splitlines() if x.startswith("NSpid:"))
            if int(line.split()[-1]) == ns_pid:
                return pid
        raise ProcessLookupError(f"no process {ns_pid} on host {self.rank}")

    def start(self, argv: list[str], log: Path, env: dict[str, str], fresh: bool = False) -> Any:
        """``argv`` (``vllm ...``) in a child of this host's fork server; ``fresh``:
        in a new interpreter, as a user's shell starts it (``fresh_vllm``)."""
        module = "vllm_ppspec_tools.hosts.fresh_vllm" if fresh else "vllm.entrypoints.cli.main"
        job = self.server.start(module, argv, str(log), env)
        self.jobs.append(job)
        return job

    def kill_job(self, job: Any) -> None:
        try:
            os.killpg(self.root_pid(job.pid), signal.SIGKILL)
        except ProcessLookupError:
            pass

    def link_up(self) -> None:
        _ip("-n", self.host.netns, "link", "set", self.host.ifname, "up")

    def kill_host(self) -> None:
        """SIGKILL process 1: the kernel kills every process of the host."""
        os.kill(self.init_pid(), signal.SIGKILL)


@dataclass
class Hosts:
    nodes: tuple[Node, ...]  # host r runs PP rank r (node rank r)
    client_addr: str  # host 0's address on the client link (the API server's)


TwoHosts = Hosts  # the two-host callers' name


@contextmanager
def two_hosts(
    tag: str, delay_ms: float | None = None, shared_shm: bool = False, gloo_link: bool = False
) -> Iterator[Hosts]:
    """Hosts 0 and 1: :func:`pp_hosts` with two."""
    with pp_hosts(tag, 2, delay_ms, shared_shm, gloo_link) as hosts:
        yield hosts


@contextmanager
def pp_hosts(
    tag: str,
    count: int,
    delay_ms: float | None = None,
    shared_shm: bool = False,
    gloo_link: bool = False,
) -> Iterator[Hosts]:
    """Hosts 0 to ``count - 1`` (fork servers started), and the client link
    to host 0. Two hosts are linked by a veth pair, or with ``delay_ms`` by the
    delay line (``delay_line``: TUN devices, that one-way delay); more by a
    bridge (``netns.bridge_hosts``). ``shared_shm``: every host sees this
    machine's ``/dev/shm`` (:func:`start_host`). ``gloo_link``: a
    second network joins the hosts (``netns.second_network``) and gloo is
    given its interface (:func:`node_env`); a link cut by ``link_down`` on the
    first then leaves gloo's up."""
    assert delay_ms is None or count == 2, "the delay line joins two hosts"
    assert delay_ms is None or not gloo_link, "the delay line is the hosts' one link"
    with ExitStack() as stack:
        hosts: tuple[Host, ...]
        if count > 2:
            hosts = stack.enter_context(bridge_hosts(tag, count))
        elif delay_ms is None:
            hosts = stack.enter_context(veth_hosts(tag))
        else:
            hosts = stack.enter_context(bare_hosts(tag))
            a, b = hosts
            stack.enter_context(
                delay_link(a.netns, a.ifname, a.addr, b.netns, b.ifname, b.addr, delay_ms)
            )
        glooed: tuple[Host | None, ...] = (None,) * count
        if gloo_link:
            glooed = stack.enter_context(second_network(hosts))
        a = hosts[0]
        subnet = a.addr.split(".")[2]
        root_if, host_if = f"{a.ifname[:-1]}c", f"{a.ifname[:-1]}d"
        client_addr = f"10.232.{subnet}.2"
        _ip("link", "add", root_if, "type", "veth", "peer", "name", host_if)
        stack.callback(subprocess.run, ["ip", "link", "delete", root_if], capture_output=True)
        _ip("link", "set", host_if, "netns", a.netns)
        _ip("addr", "add", f"10.232.{subnet}.1/24", "dev", root_if)
        _ip("link", "set", root_if, "up")
        _ip("-n", a.netns, "addr", "add", f"{client_addr}/24", "dev", host_if)
        _ip("-n", a.netns, "link", "set", host_if, "up")
        nodes = []
        for rank, (host, gloo) in enumerate(zip(hosts, glooed, strict=True)):
            node = start_host(rank, host, gloo, shared_shm)
            stack.callback(_end_host, node)
            nodes.append(node)
        for node in nodes:
            node.server._ensure()
        yield Hosts(tuple(nodes), client_addr)


def _end_host(node: Node) -> None:
    for job in node.jobs:
        node.kill_job(job)
    try:
        node.kill_host()
    except (OSError, IndexError, AssertionError):
        pass
    deadline = time.monotonic() + 30
    while node.pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    node.server.close()
    node.launcher.kill()
    shutil.rmtree(node.home, ignore_errors=True)


def node_args(
    models,
    drafter: str | tuple[str, dict] | None,
    hosts: Hosts,
    rank: int,
    *extra: str,
    eager: bool = True,
) -> list[str]:
    """One node's ``vllm serve`` command line, one PP rank per host
    (``--pipeline-parallel-size`` and ``--nnodes`` the hosts' count):
    ``drafter`` a tiny drafter's name, or (model path, speculative config);
    ``None``: no speculation (the plugin's worker then changes nothing);
    ``eager=False``: compiled."""
    pp = len(hosts.nodes)
    if isinstance(drafter, tuple):
        model, spec = drafter
    else:
        target, spec = tiny_spec(models, drafter or "draft_copy", K)
        model = models[target]
    base = serve_args(model, "tiny", MAX_MODEL_LEN, *extra)
    if not eager:
        base.remove("--enforce-eager")
    if drafter is None:
        pp_args = ["--pipeline-parallel-size", str(pp), "--distributed-executor-backend", "mp"]
    else:
        pp_args = pp_spec_args(pp, spec, worker_cls=False)
    args = [
        "vllm",
        "serve",
        *base,
        *pp_args,
        "--nnodes", str(pp), "--node-rank", str(rank),
        "--master-addr", hosts.nodes[0].host.addr, "--master-port", str(MASTER_PORT),
    ]  # fmt: skip
    if rank == 0:
        return [*args, "--host", hosts.client_addr, "--port", str(API_PORT)]
    return [*args, "--headless"]


def node_env(hosts: Hosts, rank: int) -> dict[str, str]:
    """What each node needs (docs/across-hosts.md): its own address for vLLM,
    gloo's interface (the host's own, or the second network's: ``gloo_link``),
    and one OpenMP core list per local rank."""
    node = hosts.nodes[rank]
    return {
        **os.environ,
        "VLLM_HOST_IP": node.host.addr,
        "GLOO_SOCKET_IFNAME": node.gloo_host.ifname,
        "VLLM_CPU_OMP_THREADS_BIND": str(rank % (os.cpu_count() or 1)),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


class Pipeline:
    """The nodes of one ``vllm serve --nnodes N``, one per host."""

    def __init__(
        self,
        hosts: Hosts,
        models,
        drafter: str | tuple[str, dict] | None,
        tmp_path: Path,
        *extra: str,
        env: dict[int, dict[str, str]] | None = None,
        common: dict[str, str] | None = None,
        eager: bool = True,
        fresh: bool = False,
    ):
        """``env``: extra environment per host rank; ``common``: for every host;
        ``fresh``: each node's ``vllm serve`` in a new interpreter (``Node.start``)."""
        self.hosts = hosts
        self.base = f"http://{hosts.client_addr}:{API_PORT}"
        self.logs = [tmp_path / f"host{r}.log" for r in range(len(hosts.nodes))]
        self.jobs = [
            node.start(
                node_args(models, drafter, hosts, r, *extra, eager=eager),
                self.logs[r],
                {**node_env(hosts, r), **(common or {}), **(env or {}).get(r, {})},
                fresh=fresh,
            )
            for r, node in enumerate(hosts.nodes)
        ]

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r, j in enumerate(self.jobs):
                if j.poll() is not None:
                    raise RuntimeError(
                        f"host {r}'s vllm serve exited with {j.returncode}:\n"
                        + "\n".join(p.read_text()[-3000:] for p in self.logs)
                    )
            if self.health() == 200:
                return
            time.sleep(0.2)
        raise TimeoutError("\n".join(p.read_text()[-3000:] for p in self.logs))

    def health(self) -> int:
        return health(self.base)

    def stop(self) -> None:
        for node, j in zip(self.hosts.nodes, self.jobs, strict=True):
            node.kill_job(j)
