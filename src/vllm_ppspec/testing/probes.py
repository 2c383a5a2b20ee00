"""Functions sent to every worker with ``LLM.collective_rpc`` by the test jobs."""

from __future__ import annotations

from typing import Any


def drafter_embedding_digest(worker: Any) -> int | None:
    """Digest of the drafter's token embedding on this rank (None without a drafter)."""
    from vllm_ppspec.embedding_handover import embedding_digest
    from vllm_ppspec.embedding_share import drafter_embedding

    embed = drafter_embedding(getattr(worker.model_runner, "drafter", None))
    weight = getattr(embed, "weight", None)
    return None if weight is None else embedding_digest(weight)


def checkpoint_embedding_digest(model_dir: str) -> int:
    """Digest of ``model.embed_tokens.weight`` in a local safetensors checkpoint."""
    from pathlib import Path

    from safetensors import safe_open

    from vllm_ppspec.embedding_handover import embedding_digest

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if "model.embed_tokens.weight" in f.keys():  # noqa: SIM118 - safe_open API
                return embedding_digest(f.get_tensor("model.embed_tokens.weight"))
    raise FileNotFoundError(f"no model.embed_tokens.weight in {model_dir}")


def runner_clocks(worker: Any) -> tuple[float, float, float]:
    """This rank's runner-mixin clocks: seconds in the target model's forward,
    seconds inside execute_model and sample_tokens (forward included, less
    waits in the async round's collective), and steps run (execute_model calls
    with tokens). NaN without the plugin's runner."""
    runner = worker.model_runner
    return (
        float(getattr(runner, "ppspec_forward_s", float("nan"))),
        float(getattr(runner, "ppspec_step_s", float("nan"))),
        float(getattr(runner, "ppspec_steps", float("nan"))),
    )


def drafter_layers(worker: Any) -> dict[str, Any] | None:
    """How the drafter on this rank numbers its layers (None without a drafter).

    ``target_layer_count``: the target layer count an EAGLE-3 drafter was built
    with (``Eagle3LlamaForCausalLM`` sets it on its config; None for other
    drafters); ``attention_layers``: the names of the drafter's attention
    layers, numbered from that count (``model.layers.{count + i}``).
    """
    drafter = getattr(worker.model_runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is None:
        return None
    names = sorted(
        {
            str(module.layer_name)
            for module in model.modules()
            if hasattr(module, "kv_cache") and hasattr(module, "layer_name")
        }
    )
    config = getattr(model, "config", None)
    return {
        "target_layer_count": getattr(config, "target_layer_count", None),
        "attention_layers": names,
    }
