"""The refusal of each speculative method the plugin does not run under PP
names why and what to run instead (src/vllm_ppspec/choice/unserved.py),
through ``EngineArgs(...).create_engine_config()`` as a user's line builds it.
"""

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


def _config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model, dtype="float32", max_model_len=256, **kwargs
    ).create_engine_config()


MLP_SPECULATOR = "MLPSpeculatorPreTrainedModel"


def _mlp_speculator_dir(tmp_path) -> str:
    """A drafter directory whose config is an MLP speculator's (IBM's format):
    vLLM takes the method from its ``model_type``."""
    import json

    config = {
        "model_type": "mlp_speculator",
        "architectures": [MLP_SPECULATOR],
        "n_predict": 3,
        "emb_dim": 128,
        "inner_dim": 128,
        "vocab_size": 512,
        "top_k_tokens_per_head": [1, 1, 1],
        "n_candidates": 1,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.fixture
def mlp_speculator_registered(monkeypatch):
    """vLLM's MLPSpeculator class registered for its architecture, as a user's
    own plugin would (vLLM 0.32 leaves it out of its registry): the only way a
    line with an MLP speculator gets past vLLM's own model check."""
    from vllm import ModelRegistry

    try:
        from vllm.model_executor.models.mlp_speculator import MLPSpeculator
    except ImportError:  # vLLM 0.33 has no MLP speculator (nor the method)
        return
    monkeypatch.setattr(ModelRegistry, "models", dict(ModelRegistry.models))
    ModelRegistry.register_model(MLP_SPECULATOR, MLPSpeculator)


@pytest.mark.parametrize("method", ["dspark", "ngram_gpu", "mlp_speculator"])
@pytest.mark.parametrize("pp", [2, 3])
def test_each_method_not_run_under_pp_is_refused_naming_why(
    models, tmp_path, mlp_speculator_registered, method, pp
):
    """A user's line (no --worker-cls) with PP and the method: the config is
    refused when it is built, in the words of unserved.py: why, and what to
    run instead."""
    if method not in vllm_methods():
        pytest.skip(f"this vLLM has no {method!r} method (its refusal: the test below)")
    spec = {
        "dspark": {"method": "dspark"},  # its stages in the target's checkpoint
        "ngram_gpu": {"method": "ngram_gpu", "prompt_lookup_max": 3},
        "mlp_speculator": {"model": _mlp_speculator_dir(tmp_path)},
    }[method]
    spec["num_speculative_tokens"] = 3
    with pytest.raises(ValueError) as e:
        _config(models["target"], pipeline_parallel_size=pp, speculative_config=spec)
    message = str(e.value)
    assert f"speculative method {method!r} with pipeline parallelism" in message, message
    assert "under vllm-ppspec" in message, message
    for words in EXPECTED[method]:
        assert words in message, message
    assert "medusa" in message  # the methods it runs


@pytest.mark.parametrize("pp", [1, 2])
def test_an_mlp_speculator_is_vllms_own_refusal_at_any_pp(models, tmp_path, pp):
    """What unserved.py says of mlp_speculator: vLLM refuses the line itself at
    any PP size, before the plugin is asked (0.32 registers no model class for
    it; on 0.33 its config is refused before that)."""
    spec = {"model": _mlp_speculator_dir(tmp_path), "num_speculative_tokens": 3}
    from vllm_ppspec.compat.guard import installed_vllm_version

    refused = {  # 0.32: no model class registered; 0.33: Transformers' config first
        "0.32.0": rf"Model architectures \['{MLP_SPECULATOR}'\] are not",
        "0.33.0": r"model type `mlp_speculator` but Transformers does not recognize",
    }[installed_vllm_version()]
    with pytest.raises(ValueError, match=refused) as e:
        _config(models["target"], pipeline_parallel_size=pp, speculative_config=spec)
    assert "vllm-ppspec" not in str(e.value)


def test_the_extract_hidden_states_refusal_names_why():
    """vLLM refuses PP + extract_hidden_states before the plugin is asked
    (below); the plugin's own words, should vLLM let it through, on a stand-in
    of the config the refusals read."""
    from vllm_ppspec.patches.config.refusals import pp_spec_unsupported

    method = "extract_hidden_states"
    (reason,) = pp_spec_unsupported(_pp_spec_namespace("mp", False, method, 2, 1))
    assert reason.startswith(f"speculative method {method!r} with pipeline"), reason
    for words in EXPECTED[method]:
        assert words in reason, reason


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
