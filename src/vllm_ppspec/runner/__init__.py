"""The workers' side: vLLM's V1 runner (GPU and CPU) with the plugin's mixin
(``mixin.py``), the one view of vLLM's runner its parts use (``view.py``) and
the clocks (``clocks.py``); in folders, what the mixin dispatches to:
``steps/`` (the mode's steps objects), ``drafter/`` (the drafter under PP),
``health/`` (ranks that fail, die, stop or start differently) and
``platform/`` (the GPU and CPU runner and workers vLLM builds)."""
