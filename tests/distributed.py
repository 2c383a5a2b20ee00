"""Run a function in N forked processes joined by a gloo process group.

Each rank's return value or exception comes back to the parent; a rank that
does not finish within ``timeout`` seconds is killed and reported as a hang,
so a test of a collective fails instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class RankResult:
    rank: int
    value: Any = None
    error: str | None = None  # exception class name
    message: str = ""
    hung: bool = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(
    fn: Callable[[int, int], Any], rank: int, world: int, port: int, vllm_groups: bool, q: Any
) -> None:
    try:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ["VLLM_DIST_IDENT"] = f"ppspec-test-{port}"
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
        value = fn(rank, world)
        q.put(RankResult(rank, value=value))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        q.put(RankResult(rank, error=type(e).__name__, message=f"{e}\n{traceback.format_exc()}"))


def run_ranks(
    fn: Callable[[int, int], Any], world: int = 2, timeout: float = 60.0, vllm_groups: bool = False
) -> list[RankResult]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_child, args=(fn, r, world, port, vllm_groups, q)) for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, RankResult] = {}
    import queue as _queue
    import time

    deadline = time.monotonic() + timeout
    while len(results) < world and time.monotonic() < deadline:
        try:
            res = q.get(timeout=max(0.1, deadline - time.monotonic()))
            results[res.rank] = res
        except _queue.Empty:
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
    return [results.get(r, RankResult(r, hung=True)) for r in range(world)]
