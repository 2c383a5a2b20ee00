"""The classes vLLM builds, per device: the GPU worker (``gpu_worker.py``,
building ``runner/mixin.py``'s ``PPSpecGPUModelRunner``), and the CPU runner
(``cpu.py``, the same mixin on vLLM's ``CPUModelRunner``) with its worker
(``cpu_worker.py``, which also installs the CPU patches). The public name users
type stays ``vllm_ppspec.worker.PPSpecWorker``, which picks one of the two
workers."""
