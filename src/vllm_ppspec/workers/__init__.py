"""The workers vLLM builds, per device: ``gpu.py`` (vLLM's GPU worker building
``runner/mixin.py``'s ``PPSpecGPUModelRunner``) and ``cpu.py`` (vLLM's CPU
worker building ``runner/cpu_runner.py``'s ``PPSpecCPUModelRunner``). Each
installs the registry's ``worker`` group at ``init_device``
(``patches.install_group``). The public name users type stays
``vllm_ppspec.worker.PPSpecWorker``, which picks one of the two."""
