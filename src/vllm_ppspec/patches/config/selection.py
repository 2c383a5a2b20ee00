"""Apply who serves (``choice.worker.decide``) to a config's ``worker_cls``, with one log line.

Called by the ``VllmConfig.__post_init__`` wrapper (``patches/config/__init__.py``)
before vLLM's own, in every process that builds a config.
"""

from __future__ import annotations

from typing import Any

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.choice.worker import (
    AUTO_ENV,
    SUPPORTED_PP_METHODS,
    Choice,
    Decision,
    decide,
    facts_of,
    plugin_named,
)

# The lines the plugin serves (choice.worker.plugin_line), as the notices name them.
PLUGIN_LINES = "speculative decoding with pipeline parallelism, or data parallelism on a MoE model"
AUTO_NOTICE = (
    f"vllm-ppspec: {PLUGIN_LINES}, and --worker-cls auto: selected the worker "
    f"{WORKER_QUALNAME} ({AUTO_ENV}=0 keeps vLLM's own)"
)
V2_NOTICE = (
    f"vllm-ppspec: vLLM's Model Runner V2 serves this configuration ({PLUGIN_LINES}): "
    "the plugin leaves it alone ({why}; {auto}=always selects the plugin's worker)"
)
PLATFORM_NOTICE = (
    "vllm-ppspec: vLLM's own worker serves this configuration ({why}); the plugin changes nothing"
)
EXPLICIT_NOTICE = "vllm-ppspec: --worker-cls {worker}: {why}"
FOREIGN_WARNING = (
    f"vllm-ppspec: --worker-cls {{worker}} with {PLUGIN_LINES}: vLLM's V1 runner "
    "(0.32, 0.33) fails there; vllm-ppspec leaves this worker alone (use --worker-cls "
    f"auto or {WORKER_QUALNAME})"
)

# vLLM's own use_v2_model_runner getter, kept by install() before it is wrapped.
vllm_use_v2: Any = None


def select_worker(vllm_config: Any) -> Decision:
    """Who serves (:mod:`vllm_ppspec.choice.worker`), applied to ``worker_cls``.

    Runs before vLLM's ``VllmConfig.__post_init__`` (whose platform hook turns
    ``auto`` into vLLM's own worker), in every process that builds a config.
    Off the lines the plugin serves (``choice.worker.plugin_line``) it changes
    nothing and logs nothing. ``--worker-cls auto`` becomes the plugin's worker
    where the rule says so;
    the plugin's worker named on a line where vLLM picks Model Runner V2 and
    the plugin has nothing to do becomes ``auto`` again (vLLM's own worker
    serves); a refusal (another platform, V2 required) raises ValueError here;
    an explicit other worker is left alone, with a warning where it runs the
    V1 runner. A ``VLLM_PPSPEC_AUTO`` value the plugin does not take is refused
    where it is read (on a plugin line with ``--worker-cls auto``).
    """
    decision = decide(facts_of(vllm_config, vllm_use_v2))
    parallel = vllm_config.parallel_config
    worker = parallel.worker_cls
    if decision.choice is Choice.REFUSED:
        raise ValueError(decision.why)
    if decision.choice is Choice.PLUGIN and worker == "auto":
        parallel.worker_cls = WORKER_QUALNAME
        _log_once("info", AUTO_NOTICE)
    elif decision.choice is Choice.VLLM_V2 and plugin_named(worker):
        parallel.worker_cls = "auto"
        _log_once("info", EXPLICIT_NOTICE.format(worker=worker, why=decision.why))
    elif decision.choice is Choice.VLLM_V2 and worker == "auto":
        _log_once("info", V2_NOTICE.format(why=decision.why, auto=AUTO_ENV))
    elif decision.choice is Choice.OTHER_PLATFORM and worker == "auto":
        _log_once("info", PLATFORM_NOTICE.format(why=decision.why))
    elif decision.choice is Choice.VLLM_V1 and worker != "auto":
        if vllm_config.speculative_config.method in SUPPORTED_PP_METHODS:
            _log_once("warning", FOREIGN_WARNING.format(worker=worker))
    return decision


def _log_once(level: str, msg: str) -> None:
    from vllm.logger import init_logger

    getattr(init_logger("vllm.ppspec"), f"{level}_once")(msg)
