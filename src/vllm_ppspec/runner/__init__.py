"""The workers' side: vLLM's V1 runner (GPU and CPU) with the plugin's mixin.

``mixin.py`` (GPU runner) and ``cpu_runner.py`` (CPU runner), the one view of
vLLM's runner their parts use (``view.py``) and the clocks (``clocks.py``); in
folders, what the mixin dispatches to: ``steps/`` (the mode's steps objects),
``drafter/`` (the drafter under PP: hidden, handed the target's embedding,
agreed across DP, or run on the first stage) and ``health/`` (ranks that fail,
die, stop or start differently). The workers that build these runners are in
``vllm_ppspec/workers/``."""
