"""EAGLE-3 and DFlash under PP: the target's auxiliary hidden states cross the stages.

An EAGLE-3 drafter reads hidden states of a few target layers, and so does a
DFlash drafter (``dflash_config.target_layer_ids``, plus one: vLLM's
``get_eagle3_aux_layers_from_config`` reads both; the V1 runner turns the
outputs on for every DFlash drafter). Under PP those
layers sit on several stages: earlier stages compute theirs and ship them in
their intermediate tensors (vLLM's ``set_eagle3_aux_hidden_state_layers``),
middle stages pass on what they received (:func:`relay`), and the last rank
reserves receive slots for them (``reserve_aux_intermediate_tensor_slots``).
The helpers are vLLM's own, from Model Runner V2 (vllm/v1/worker/gpu/spec_decode/
eagle/eagle3_utils.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
    aux_hidden_state_relay_keys,
    reserve_aux_intermediate_tensor_slots,
    set_eagle3_aux_hidden_state_layers,
    verify_supports_aux_hidden_states_over_pp,
)

# Methods whose drafter reads the target's auxiliary states whatever its config
# says (GPUModelRunner.__init__ sets use_aux_hidden_state_outputs for them).
ALWAYS_AUX = ("dflash",)


def uses_aux_states(spec: Any) -> bool:
    """Whether this speculative config's drafter reads auxiliary states: an
    EAGLE-3 head that uses them (its ``eagle_config``), or a method of
    :data:`ALWAYS_AUX`."""
    if not spec or spec.method not in ("eagle3", *ALWAYS_AUX):
        return False
    if spec.draft_model_config is None:
        return False
    if spec.method in ALWAYS_AUX:
        return True
    eagle_config = getattr(spec.draft_model_config.hf_config, "eagle_config", None) or {}
    return bool(eagle_config.get("use_aux_hidden_state", True))


def require_aux_hidden_states_over_pp(model: Any, method: str = "eagle3") -> None:
    """Refuse ``method`` under PP for a target that cannot ship its auxiliary states.

    vLLM's V2 runner makes the same check (``verify_supports_aux_hidden_states_over_pp``);
    without it the later helpers return silently and the drafter gets no states.
    """
    try:
        verify_supports_aux_hidden_states_over_pp(model, method)
    except ValueError as e:
        raise ValueError(
            f"vllm-ppspec: {e}: the target's decoder does not pass auxiliary hidden "
            "states between PP stages (vLLM's supports_aux_hidden_states_over_pp: "
            f"Llama, Qwen2 and models built on them). Use --pipeline-parallel-size 1 "
            f"for {method} with this model, or another method (eagle, draft_model, ngram, mtp)."
        ) from e


def set_up(model: Any, spec: Any, is_last: bool, vllm_setup: Callable[[], None]) -> None:
    """Every PP rank, at set-up (same model class: every rank raises alike)."""
    require_aux_hidden_states_over_pp(model, spec.method)
    if is_last:
        # vLLM sets the layers; the receive buffer also needs the slots of the
        # auxiliary states computed on earlier stages.
        vllm_setup()
        reserve_aux_intermediate_tensor_slots(model)
    else:
        # Earlier stages compute some of the auxiliary layers and ship them in
        # their intermediate tensors; the runner itself still returns plain
        # intermediate tensors (use_aux_hidden_state_outputs stays off).
        set_eagle3_aux_hidden_state_layers(model, spec)


def relay(model: Any, output: Any, received: Any) -> None:
    """A middle stage passes on the auxiliary states of the stages before it
    (vLLM's model only packs its own layers' states)."""
    for key in aux_hidden_state_relay_keys(model):
        output.tensors[key] = received[key]
