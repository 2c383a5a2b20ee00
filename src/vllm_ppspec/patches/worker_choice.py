"""Who serves PP + speculative decoding: vLLM itself or the plugin's worker.

Decided once per config, before vLLM's ``VllmConfig.__post_init__`` turns
``--worker-cls auto`` into its own worker. The plugin extends vLLM's V1 model
runner, so it takes over only where vLLM would run that runner for this
config; where vLLM picks its Model Runner V2 (on CUDA with Triton, by
default), V2's own PP + spec path serves it and the plugin stays out.

:func:`decide` is a pure function of the facts (:class:`Facts`), so the whole
table (docs/support.md, "Who serves PP + speculative decoding") is tested cell
by cell; :func:`facts_of` reads them from a ``VllmConfig`` and the environment.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any

from vllm_ppspec import WORKER_QUALNAME

# Methods the plugin runs under PP.
SUPPORTED_PP_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")

# "0": keep vLLM's own worker; "always": the plugin's worker also where vLLM
# would pick Model Runner V2 by default; unset or "1": where vLLM runs V1.
AUTO_ENV = "VLLM_PPSPEC_AUTO"


class Choice(enum.Enum):
    PLUGIN = "the plugin's worker (V1 runner)"
    VLLM_V1 = "vLLM's own worker, V1 runner"
    VLLM_V2 = "vLLM's own worker, Model Runner V2"
    VLLM = "vLLM's own choice (no PP + spec)"
    REFUSED = "refused"


@dataclass(frozen=True)
class Facts:
    pp: int
    method: str | None  # None: no speculative config
    worker_cls: str  # "auto", the plugin's, or another
    auto: str  # AUTO_ENV's value ("1" when unset)
    v2_required: str | None  # why vLLM must run V2 here (env=1, HiSparse, watermark)
    v2_by_default: bool  # vLLM would pick V2 for this config on its own


@dataclass(frozen=True)
class Decision:
    choice: Choice
    why: str


def plugin_named(worker_cls: Any) -> bool:
    return isinstance(worker_cls, str) and worker_cls.startswith("vllm_ppspec.")


def decide(f: Facts) -> Decision:
    """Who serves this config; see the module docstring and docs/support.md."""
    if f.pp <= 1 or f.method is None:
        return Decision(Choice.VLLM, "no PP + speculative decoding: nothing to take over")
    if plugin_named(f.worker_cls):
        if f.v2_required is not None:
            return Decision(Choice.REFUSED, v2_refusal(f.v2_required))
        return Decision(Choice.PLUGIN, "--worker-cls names the plugin's worker")
    if f.worker_cls != "auto":
        v = Choice.VLLM_V2 if f.v2_required or f.v2_by_default else Choice.VLLM_V1
        return Decision(v, f"--worker-cls {f.worker_cls}: the user's choice")
    if f.v2_required is not None:
        return Decision(Choice.VLLM_V2, f"{f.v2_required} requires Model Runner V2")
    if f.auto == "0":
        v = Choice.VLLM_V2 if f.v2_by_default else Choice.VLLM_V1
        return Decision(v, f"{AUTO_ENV}=0")
    if f.method not in SUPPORTED_PP_METHODS:
        v = Choice.VLLM_V2 if f.v2_by_default else Choice.VLLM_V1
        return Decision(v, f"method {f.method!r} is not one the plugin runs under PP")
    if f.v2_by_default and f.auto != "always":
        return Decision(Choice.VLLM_V2, "vLLM picks Model Runner V2, which has its own PP + spec")
    if f.v2_by_default:
        return Decision(Choice.PLUGIN, f"{AUTO_ENV}=always")
    return Decision(Choice.PLUGIN, "vLLM runs its V1 runner here, which fails with PP + spec")


def v2_refusal(reason: str) -> str:
    return (
        f"vllm-ppspec: --worker-cls {WORKER_QUALNAME} extends vLLM's V1 model runner, and "
        f"{reason} requires Model Runner V2: use --worker-cls auto (vLLM's V2 serves "
        "PP + speculative decoding itself) or drop that setting"
    )


def v2_required(vllm_config: Any) -> str | None:
    """What makes vLLM run Model Runner V2 whatever else is set (as its
    ``VllmConfig.use_v2_model_runner`` reads them), or None."""
    import vllm.envs as envs

    if getattr(vllm_config.attention_config, "hisparse_config", None) is not None:
        return "HiSparse"
    if getattr(vllm_config, "watermark_config", None) is not None:
        return "watermarking"
    if envs.VLLM_USE_V2_MODEL_RUNNER is True:
        return "VLLM_USE_V2_MODEL_RUNNER=1"
    return None


def facts_of(vllm_config: Any, vllm_use_v2: Any) -> Facts:
    """The facts for :func:`decide`; ``vllm_use_v2`` is vLLM's own, unwrapped
    ``use_v2_model_runner`` getter (called only under PP + spec)."""
    spec = vllm_config.speculative_config
    parallel = vllm_config.parallel_config
    pp = int(parallel.pipeline_parallel_size)
    method = None if spec is None else str(spec.method)
    active = pp > 1 and method is not None
    required = active or plugin_named(parallel.worker_cls)
    return Facts(
        pp=pp,
        method=method,
        worker_cls=str(parallel.worker_cls),
        auto=os.environ.get(AUTO_ENV, "1"),
        v2_required=v2_required(vllm_config) if required else None,
        v2_by_default=bool(active and _vllm_picks_v2(vllm_config, vllm_use_v2)),
    )


def _vllm_picks_v2(vllm_config: Any, vllm_use_v2: Any) -> bool:
    try:
        return bool(vllm_use_v2(vllm_config))
    except ValueError:  # vLLM refuses the combination itself (e.g. HiSparse + env=0)
        return True
