"""Why the plugin's worker does not run a speculative method under pipeline
parallelism, method by method: the words of its refusal
(``patches/config/refusals.py``), which name what to run instead.

The methods it runs are ``choice.worker.SUPPORTED_PP_METHODS``.
"""

from __future__ import annotations

_AUX_STATES = (
    "its drafter reads the target's auxiliary hidden states of layers on every PP "
    "stage, which the plugin relays for eagle3 and dflash only"
)

WHY_UNSERVED: dict[str, str] = {
    "mlp_speculator": (
        "vLLM 0.32 and 0.33 register no model class for it "
        "(MLPSpeculatorPreTrainedModel is commented out in "
        "vllm/model_executor/models/registry.py), so vLLM cannot run it at any PP size"
    ),
    "ngram_gpu": (
        "its proposer keeps CUDA buffers and events, and the plugin runs it nowhere: on "
        "CUDA with Triton vLLM's Model Runner V2 serves it under PP; elsewhere use "
        "method 'ngram'"
    ),
    "dspark": (
        f"{_AUX_STATES}; use method 'eagle3' or 'dflash', or dspark at PP=1 where vLLM "
        "runs Model Runner V2 (its V1 runner, the CPU backend's, has no dspark)"
    ),
    "extract_hidden_states": (
        "vLLM refuses it under PP itself, before the plugin is asked: SpeculativeConfig "
        "checks SupportsPP on its ExtractHiddenStatesModel (vllm/config/speculative.py, "
        "verify_with_parallel_config), and the connector vLLM ships for it, "
        "ExampleHiddenStatesConnector, expects its cache-only layer on every worker "
        "(register_kv_caches asserts one CacheOnlyAttentionLayer; PP stages before the "
        "last hold none) and writes through CUDA pinned memory; run it at PP=1"
    ),
}


def why_unserved(method: str) -> str:
    """Why the plugin does not run ``method`` under PP, and what to run instead."""
    from vllm_ppspec.choice.worker import SUPPORTED_PP_METHODS

    served = ", ".join(SUPPORTED_PP_METHODS)
    why = WHY_UNSERVED.get(method, "the plugin has no test of it")
    return f"{why} (methods vllm-ppspec runs under PP: {served})"
