"""Keep the CPU worker's OpenMP thread count when vLLM's ngram proposer runs.

vLLM's ``NgramProposer.batch_propose`` (vllm/v1/spec_decode/ngram_proposer.py)
runs a ``numba`` parallel function, and calls numba's ``get_num_threads`` /
``set_num_threads`` around it. The first such call starts numba's OpenMP
threading layer, which sets the OpenMP thread count of the process to numba's
(the machine's core count) in the same GNU OpenMP runtime as torch (vLLM's CPU
wheel ships no Intel OpenMP unless it is in ``LD_PRELOAD``; vLLM's CPU worker
warns about that for speculative decoding). From the first proposal on, every
torch operator of the worker then runs with that many OpenMP threads instead
of the cores vLLM bound to it (``VLLM_CPU_OMP_THREADS_BIND``): with one core
per rank, a team of spinning threads on each core, several times slower than
without speculation (docs/measurements.md, "patches/worker/cpu_ngram_threads.py").

:func:`install`, in the plugin's CPU worker after vLLM bound its threads and
only when the speculative method is ngram, starts numba's threading layer
itself, puts torch's thread count back, and sets numba's count to it: the
proposer's own get / set then leave OpenMP alone.
"""

from __future__ import annotations

from typing import Any

import torch


def install(worker: Any = None) -> int:
    """Start numba's threading layer without changing torch's thread count; the
    thread count, or 0 where ``worker`` drafts with another method than ngram."""
    if worker is not None:
        spec = worker.vllm_config.speculative_config
        if spec is None or spec.method != "ngram":
            return 0
    import numba

    threads = torch.get_num_threads()
    numba.get_num_threads()  # starts numba's threading layer
    # vLLM's CPU worker replaced torch.set_num_threads with a no-op after its
    # binding; the original is torch._C.set_num_threads.
    torch._C.set_num_threads(threads)
    numba.set_num_threads(min(threads, int(numba.config.NUMBA_NUM_THREADS)))
    return threads
