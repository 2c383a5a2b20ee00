"""Who serves speculative decoding with PP or DP: vLLM itself or the plugin's worker.

:func:`plugin_line` is the one rule of where the plugin acts: speculative
decoding with PP > 1, or with DP > 1 on a MoE target (vLLM runs a MoE
model's DP ranks as one engine, whose drafter runs must agree across ranks;
a dense model's DP ranks run as independent DP=1 engines, where vLLM's own
worker serves spec). The plan of a config (:mod:`vllm_ppspec.choice.plan`)
applies it once; the selection (:func:`decide`) applies it to the facts.

Decided once per config, before vLLM's ``VllmConfig.__post_init__`` turns
``--worker-cls auto`` into its own worker. The plugin extends vLLM's V1 model
runner on the platforms it has a worker for (:data:`PLUGIN_PLATFORMS`), so it
takes over only there and only where vLLM would run that runner for this
config; where vLLM picks its Model Runner V2 (on CUDA with Triton, by
default), V2 serves it and the plugin stays out. ``VLLM_PPSPEC_AUTO`` is read
(and an unknown value refused) only on a plugin line with ``--worker-cls auto``
on a platform it has a worker for: elsewhere it cannot change anything.

:func:`decide` is a pure function of the facts (:class:`Facts`), so the whole
table (docs/support.md, "Who serves PP + speculative decoding") is tested cell
by cell; :func:`facts_of` reads them from a ``VllmConfig``, vLLM's platform and
the environment.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import Any

from vllm_ppspec import WORKER_QUALNAME

# Methods the plugin runs under PP and DP.
SUPPORTED_PP_METHODS = (
    "ngram",
    "draft_model",
    "eagle",
    "eagle3",
    "mtp",
    "medusa",
    "custom_class",
    "suffix",
    "dflash",
)

# The platforms the plugin has a worker for (vllm_ppspec.worker).
PLUGIN_PLATFORMS = ("cpu", "cuda")

AUTO_ENV = "VLLM_PPSPEC_AUTO"
# AUTO_ENV's values (any case), each read as one of "off", "on", "always".
AUTO_VALUES = {
    **dict.fromkeys(("0", "false", "off", "no"), "off"),
    **dict.fromkeys(("1", "true", "on", "yes", ""), "on"),
    "always": "always",
}
AUTO_REFUSAL = (
    "vllm-ppspec: {env}={value!r} is not a value it takes: 0, false, off or no keep "
    "vLLM's own worker; 1, true, on, yes, empty or unset select the plugin's worker where "
    "vLLM runs its V1 runner; always also where vLLM would pick Model Runner V2"
)


def auto_setting(raw: str | None) -> str:
    """``VLLM_PPSPEC_AUTO`` as the plugin reads it: "off", "on" or "always";
    any other value is refused (ValueError naming the variable and its values)."""
    if raw is None:
        return "on"
    value = AUTO_VALUES.get(raw.strip().lower())
    if value is None:
        raise ValueError(AUTO_REFUSAL.format(env=AUTO_ENV, value=raw))
    return value


class Choice(enum.Enum):
    PLUGIN = "the plugin's worker (V1 runner)"
    VLLM_V1 = "vLLM's own worker, V1 runner"
    VLLM_V2 = "vLLM's own worker, Model Runner V2"
    VLLM = "vLLM's own choice (not a line the plugin serves)"
    OTHER_PLATFORM = "vLLM's own worker (a platform the plugin has no worker for)"
    REFUSED = "refused"


@dataclass(frozen=True)
class Facts:
    pp: int
    method: str | None  # None: no speculative config
    worker_cls: str  # "auto", the plugin's, or another
    auto: str  # auto_setting(AUTO_ENV): "on", "off" or "always"
    v2_required: str | None  # why vLLM must run V2 here (env=1, HiSparse, watermark)
    v2_by_default: bool  # vLLM would pick V2 for this config on its own
    dp: int = 1
    platform: str = "cpu"  # "cpu", "cuda", or another platform's device name
    moe: bool = False  # the target is a MoE model (vLLM runs its DP ranks as one engine)


@dataclass(frozen=True)
class Decision:
    choice: Choice
    why: str


def plugin_named(worker_cls: Any) -> bool:
    return isinstance(worker_cls, str) and worker_cls.startswith("vllm_ppspec.")


def plugin_line(pp: int, dp: int, method: str | None, moe: bool) -> bool:
    """The one rule of where the plugin acts: speculative decoding (``method``
    not None) with PP > 1, or with DP > 1 on a MoE target. A dense target's DP
    ranks run as independent DP=1 engines (vLLM's ``EngineCoreProc``), each
    served by vLLM's own worker; a MoE target's run as one engine whose drafter
    runs must agree across the DP ranks, which the plugin's worker does."""
    return method is not None and (pp > 1 or (dp > 1 and moe))


def line_of(vllm_config: Any) -> tuple[int, int, str | None, bool]:
    """(PP, DP, speculative method or None, MoE target) of a config, for
    :func:`plugin_line`; a model runner, which holds the same three configs, works too."""
    parallel = vllm_config.parallel_config
    spec = vllm_config.speculative_config
    pp = int(parallel.pipeline_parallel_size)
    dp = int(parallel.data_parallel_size)
    method = None if spec is None else str(spec.method)
    # MoE matters only for DP at PP = 1 (read lazily: it reads the HF config).
    moe = method is not None and pp <= 1 and dp > 1 and _is_moe(vllm_config)
    return pp, dp, method, moe


def _is_moe(vllm_config: Any) -> bool:
    model_config = getattr(vllm_config, "model_config", None)
    return bool(model_config is not None and model_config.is_moe)


def decide(f: Facts) -> Decision:
    """Who serves this config; see the module docstring and docs/support.md."""
    active = plugin_line(f.pp, f.dp, f.method, f.moe)
    if plugin_named(f.worker_cls):
        if f.platform not in PLUGIN_PLATFORMS:
            return Decision(Choice.REFUSED, platform_refusal(f.platform))
        if not active:
            if f.v2_required is not None or f.v2_by_default:
                return Decision(Choice.VLLM_V2, EXPLICIT_ELSEWHERE)
            return Decision(Choice.PLUGIN, "--worker-cls names the plugin's worker")
        if f.v2_required is not None:
            return Decision(Choice.REFUSED, v2_refusal(f.v2_required))
        return Decision(Choice.PLUGIN, "--worker-cls names the plugin's worker")
    if not active:
        return Decision(Choice.VLLM, NOT_A_PLUGIN_LINE)
    if f.platform not in PLUGIN_PLATFORMS:
        return Decision(
            Choice.OTHER_PLATFORM, f"the plugin has no worker for the {f.platform} platform"
        )
    if f.worker_cls != "auto":
        v = Choice.VLLM_V2 if f.v2_required or f.v2_by_default else Choice.VLLM_V1
        return Decision(v, f"--worker-cls {f.worker_cls}: the user's choice")
    if f.v2_required is not None:
        return Decision(Choice.VLLM_V2, f"{f.v2_required} requires Model Runner V2")
    if f.auto == "off":
        v = Choice.VLLM_V2 if f.v2_by_default else Choice.VLLM_V1
        return Decision(v, f"{AUTO_ENV} is off")
    if f.method not in SUPPORTED_PP_METHODS:
        if f.v2_by_default:
            return Decision(Choice.VLLM_V2, "vLLM picks Model Runner V2, which serves it itself")
        # vLLM's V1 worker fails on this line at start-up; the plugin's worker
        # refuses it at config time naming why (unserved.py, refusals.py).
        return Decision(Choice.PLUGIN, f"method {f.method!r} under PP on V1: refused, naming why")
    if f.v2_by_default and f.auto != "always":
        return Decision(Choice.VLLM_V2, "vLLM picks Model Runner V2, which serves it itself")
    if f.v2_by_default:
        return Decision(Choice.PLUGIN, f"{AUTO_ENV}=always")
    return Decision(
        Choice.PLUGIN, "vLLM runs its V1 runner here, which serves this line only with the plugin"
    )


NOT_A_PLUGIN_LINE = (
    "not speculative decoding with PP > 1 or with DP > 1 on a MoE model: nothing to take over"
)
EXPLICIT_ELSEWHERE = (
    "the plugin's worker is for speculative decoding with PP, or DP on a MoE model; on "
    "this line vLLM picks Model Runner V2, and its own worker serves"
)


def platform_refusal(platform: str) -> str:
    return (
        f"vllm-ppspec: --worker-cls {WORKER_QUALNAME} has no worker for vLLM's {platform} "
        f"platform (it has one for {', '.join(PLUGIN_PLATFORMS)}): use --worker-cls auto, "
        "and vLLM's own worker serves"
    )


def platform_name() -> str:
    """vLLM's current platform: "cpu", "cuda", or its device name."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_cuda():
        return "cuda"
    return str(getattr(current_platform, "device_name", None) or type(current_platform).__name__)


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
    ``use_v2_model_runner`` getter (called only where the plugin could serve)."""
    worker = vllm_config.parallel_config.worker_cls
    pp, dp, method, moe = line_of(vllm_config)
    line = plugin_line(pp, dp, method, moe)
    relevant = line or plugin_named(worker)
    platform = platform_name()
    # VLLM_PPSPEC_AUTO can change something only here: read (and refused) only here.
    reads_auto = line and worker == "auto" and platform in PLUGIN_PLATFORMS
    return Facts(
        pp=pp,
        dp=dp,
        method=method,
        worker_cls=str(worker),
        auto=auto_setting(os.environ.get(AUTO_ENV)) if reads_auto else "on",
        v2_required=v2_required(vllm_config) if relevant else None,
        v2_by_default=bool(relevant and _vllm_picks_v2(vllm_config, vllm_use_v2)),
        platform=platform,
        moe=moe,
    )


def _vllm_picks_v2(vllm_config: Any, vllm_use_v2: Any) -> bool:
    try:
        return bool(vllm_use_v2(vllm_config))
    except ValueError:  # vLLM refuses the combination itself (e.g. HiSparse + env=0)
        return True
