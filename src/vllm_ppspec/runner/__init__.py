"""The workers' side: vLLM's V1 runner (GPU and CPU) with the plugin's mixin,
and the parts it dispatches to by mode."""
