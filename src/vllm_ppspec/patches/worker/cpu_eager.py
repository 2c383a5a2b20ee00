"""Run vLLM's async spec-decode correction eagerly on CPU (no inductor compile mid-serving).

Under async scheduling with speculative decoding, ``GPUModelRunner._prepare_inputs``
corrects each request's optimistic ``num_computed_tokens`` with
``vllm.v1.spec_decode.utils.update_num_computed_tokens_for_batch_change``, a
handful of element-wise ops over ``num_reqs`` integers. vLLM wraps it in
``torch.compile(dynamic=True, backend=current_platform.simple_compile_backend)``:
on CPU that backend is inductor, which compiles C++ the first time a batch
reaches it, and again for each new specialisation (a batch of one request
specialises its size). ``enforce_eager`` does not cover it. The compile
costs seconds once, while the first requests wait, and makes the first async
steps many times slower than sync ones; in steady state an async step costs
less than a sync one (docs/measurements.md, "patches/worker/cpu_eager.py").

:func:`install` points the name ``gpu_model_runner`` calls at the uncompiled
function (``_torchdynamo_orig_callable``: the same Python body, run eagerly),
only in the plugin's CPU worker. ``VLLM_PPSPEC_CPU_COMPILED_CORRECTION=1`` keeps
vLLM's compiled one, for the benchmark's before/after
(``python -m vllm_ppspec_tools.async_cpu_bench``).
"""

from __future__ import annotations

import os

KEEP_COMPILED_ENV = "VLLM_PPSPEC_CPU_COMPILED_CORRECTION"
NAME = "update_num_computed_tokens_for_batch_change"


def install(worker: object = None) -> bool:
    """Make ``gpu_model_runner`` call the correction eagerly; True if it did
    (the ``worker`` group's entry; ``worker`` unused)."""
    if os.environ.get(KEEP_COMPILED_ENV) == "1":
        return False
    import vllm.v1.worker.gpu_model_runner as runner_module

    compiled = getattr(runner_module, NAME)
    eager = getattr(compiled, "_torchdynamo_orig_callable", None)
    if eager is None:  # already eager (installed twice, or vLLM stopped compiling it)
        return False
    setattr(runner_module, NAME, eager)
    return True
