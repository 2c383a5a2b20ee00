"""vllm-ppspec: speculative decoding under pipeline parallelism for vLLM 0.32 and 0.33.

Select the worker with ``--worker-cls vllm_ppspec.worker.PPSpecWorker``.
Importing this package does not import vLLM; the worker, runner and plugin
modules do, and check the vLLM version first (see ``vllm_ppspec.compat.guard``).
"""

WORKER_QUALNAME = "vllm_ppspec.worker.PPSpecWorker"

__version__ = "0.1.0"
