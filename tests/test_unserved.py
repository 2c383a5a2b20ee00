"""The refusal of each speculative method the plugin does not run under PP
names why and what to run instead (src/vllm_ppspec/choice/unserved.py)."""

from __future__ import annotations

import pytest

from tests.test_config_patches import _pp_spec_namespace
from vllm_ppspec.choice.unserved import WHY_UNSERVED
from vllm_ppspec.choice.worker import SUPPORTED_PP_METHODS

# What each refusal must say: the cause, and what to run instead.
EXPECTED = {
    "mlp_speculator": ("register no model class", "at any PP size"),
    "ngram_gpu": ("CUDA buffers and events", "use method 'ngram'"),
    "dspark": ("auxiliary hidden states", "use method 'eagle3' or 'dflash', or dspark at PP=1"),
    "extract_hidden_states": (
        "SupportsPP",
        "register_kv_caches asserts one CacheOnlyAttentionLayer",
        "run it at PP=1",
    ),
}


def vllm_methods() -> set[str]:
    """The speculative methods this vLLM's config takes (``SpeculativeMethod``);
    MTP model types (deepseek_mtp, ...) become method "mtp" in vLLM's config."""
    from typing import get_args

    from vllm.config.speculative import SpeculativeMethod

    def names(t) -> set[str]:
        args = get_args(t)
        return {a for x in args for a in (names(x) if get_args(x) else [x])} if args else {t}

    return {m for m in names(SpeculativeMethod) if not m.endswith("_mtp")}


def test_every_method_of_vllm_is_served_or_has_a_reason():
    methods = vllm_methods()
    assert methods - set(SUPPORTED_PP_METHODS) <= set(WHY_UNSERVED), methods
    assert not set(WHY_UNSERVED) & set(SUPPORTED_PP_METHODS)
    # medusa (0.32 only: 0.33 removed it) and mlp_speculator (0.32) come and go.
    assert set(SUPPORTED_PP_METHODS) - methods <= {"medusa"}, methods


@pytest.mark.parametrize("method", sorted(EXPECTED))
@pytest.mark.parametrize("pp,dp", [(2, 1), (3, 1)])
def test_each_method_not_run_under_pp_is_refused_naming_why(method, pp, dp):
    from vllm_ppspec.patches.config.refusals import pp_spec_unsupported

    (reason,) = pp_spec_unsupported(_pp_spec_namespace("mp", False, method, pp, dp))
    assert reason.startswith(f"speculative method {method!r} with pipeline"), reason
    for words in EXPECTED[method]:
        assert words in reason, reason
    assert "medusa" in reason  # the methods it runs


def test_the_served_methods_are_not_refused():
    from vllm_ppspec.patches.config.refusals import pp_spec_unsupported

    for method in SUPPORTED_PP_METHODS:
        assert pp_spec_unsupported(_pp_spec_namespace("mp", False, method, 2, 1)) == []


@pytest.mark.parametrize("pp", [2, 3])
def test_extract_hidden_states_under_pp_is_vllms_own_refusal(models, pp):
    """vLLM refuses PP + extract_hidden_states while it builds the speculative
    config (its model lacks SupportsPP), before any worker is chosen: what
    unserved.py says, through ``EngineArgs`` as a user builds it."""
    from vllm.engine.arg_utils import EngineArgs

    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}},
    }
    args = EngineArgs(
        model=models["target"],
        dtype="float32",
        max_model_len=256,
        pipeline_parallel_size=pp,
        speculative_config=spec,
    )
    with pytest.raises(NotImplementedError, match="Pipeline parallelism is not supported"):
        args.create_engine_config()
    # At PP = 1 the same config builds.
    args.pipeline_parallel_size = 1
    assert args.create_engine_config().speculative_config.method == "extract_hidden_states"
