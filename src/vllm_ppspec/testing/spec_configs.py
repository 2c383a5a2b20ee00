"""``--speculative-config`` for each method on the local models (demo, tests).

Tiny models (testing.tiny_models): every method the plugin supports, each
drafter built for a known acceptance. Real model (testing.real_model):
ngram on copy-heavy prompts, and ``draft_model`` with the self-speculative
drafter (SmolLM2's first layers); no EAGLE/MTP head exists for it.
"""

from __future__ import annotations

from typing import Any

TINY_METHODS = ["eagle3", "draft_model", "mtp", "ngram"]
REAL_METHODS = ["ngram", "draft_model"]


def tiny(method: str, k: int, models: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """(target path, speculative config) for ``method`` on the tiny models."""
    if method == "eagle3":
        return models["target"], {
            "method": "eagle3",
            "model": models["eagle3_succ"],
            "num_speculative_tokens": k,
        }
    if method == "draft_model":
        return models["target"], {
            "method": "draft_model",
            "model": models["draft_copy"],
            "num_speculative_tokens": k,
        }
    if method == "mtp":
        return models["mimo"], {"method": "mtp", "num_speculative_tokens": k}
    if method == "ngram":
        return models["target"], {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
    raise ValueError(f"unknown method {method!r}; choose one of {TINY_METHODS}")


def real(method: str, k: int, target: str, self_drafter: str) -> dict[str, Any]:
    """Speculative config for ``method`` on the real model."""
    from vllm_ppspec.testing.copy_prompts import NGRAM_LOOKUP

    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, **NGRAM_LOOKUP}
    if method == "draft_model":
        return {"method": "draft_model", "model": self_drafter, "num_speculative_tokens": k}
    raise ValueError(
        f"--method {method} has no drafter for the real model (it has no EAGLE/MTP head); "
        f"choose one of {REAL_METHODS}, or add --tiny for the tiny models"
    )
