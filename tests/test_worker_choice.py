"""Who serves PP + speculative decoding (``patches/worker_choice.py``), cell by
cell of docs/support.md's table, and through vLLM's real config path.

The CPU platform has no Triton, so vLLM runs its V1 runner here; CUDA's
default (Triton present: Model Runner V2) is simulated by setting
``vllm.config.vllm.HAS_TRITON`` to True, the one fact vLLM reads. No engine is
started: the configs are built by ``EngineArgs.create_engine_config``.
"""

from __future__ import annotations

import pytest

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.patches.worker_choice import Choice, Facts, decide
from vllm_ppspec.plugin import register
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

register()

P, V1, V2, NONE, REF = Choice.PLUGIN, Choice.VLLM_V1, Choice.VLLM_V2, Choice.VLLM, Choice.REFUSED
STOCK = "vllm.v1.worker.gpu_worker.Worker"


def facts(**kw) -> Facts:
    base = dict(
        pp=2,
        method="draft_model",
        worker_cls="auto",
        auto="1",
        v2_required=None,
        v2_by_default=False,
    )
    return Facts(**{**base, **kw})  # type: ignore[arg-type]


# (facts, who serves): the rows of docs/support.md, "Who serves PP + speculative decoding".
TABLE = [
    # V1 is vLLM's choice (CPU, no Triton, VLLM_USE_V2_MODEL_RUNNER=0, a V2-only feature missing)
    *[(facts(method=m), P) for m in ("ngram", "draft_model", "eagle", "eagle3", "mtp")],
    *[(facts(method=m), V1) for m in ("suffix", "ngram_gpu", "dflash", "dspark", "medusa")],
    (facts(auto="0"), V1),
    (facts(auto="always"), P),
    # V2 is vLLM's default choice (CUDA with Triton)
    *[(facts(method=m, v2_by_default=True), V2) for m in ("ngram", "draft_model", "mtp")],
    *[(facts(method=m, v2_by_default=True, auto="always"), P) for m in ("eagle3", "ngram")],
    (facts(method="dflash", v2_by_default=True, auto="always"), V2),
    (facts(v2_by_default=True, auto="0"), V2),
    # V2 is required (VLLM_USE_V2_MODEL_RUNNER=1, HiSparse, watermarking)
    *[(facts(v2_required=r), V2) for r in ("VLLM_USE_V2_MODEL_RUNNER=1", "HiSparse")],
    (facts(v2_required="watermarking", auto="always"), V2),
    (facts(v2_required="HiSparse", worker_cls=WORKER_QUALNAME), REF),
    # An explicit worker
    (facts(worker_cls=WORKER_QUALNAME, v2_by_default=True), P),
    (facts(worker_cls=WORKER_QUALNAME), P),
    (facts(worker_cls=STOCK), V1),
    (facts(worker_cls=STOCK, v2_by_default=True), V2),
    # Nothing to take over
    (facts(pp=1), NONE),
    (facts(method=None), NONE),
    (facts(pp=1, v2_by_default=True, auto="always"), NONE),
]


@pytest.mark.parametrize(("f", "who"), TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_each_cell_of_the_table(f, who):
    assert decide(f).choice is who, decide(f).why


def test_the_table_is_in_the_docs():
    """docs/support.md carries the table this module tests, and README one line of it."""
    from tests.conftest import REPO

    support = (REPO / "docs" / "support.md").read_text()
    assert "## Who serves PP + speculative decoding" in support
    readme = (REPO / "README.md").read_text()
    assert "Model Runner V2" in readme and "with its V1 runner" in readme


# ---------------------------------------------------------------------------
# Through vLLM's real config path.
# ---------------------------------------------------------------------------


@pytest.fixture
def triton(monkeypatch):
    """Set vLLM's Triton fact (True: as on CUDA) for the configs built in a test."""
    import vllm.config.vllm as vllm_config_module

    def set_to(value: bool) -> None:
        monkeypatch.setattr(vllm_config_module, "HAS_TRITON", value)

    return set_to


def _config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model, dtype="float32", max_model_len=256, **kwargs
    ).create_engine_config()


def _served_by(cfg) -> tuple[str, bool]:
    return cfg.parallel_config.worker_cls, bool(cfg.use_v2_model_runner)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("VLLM_PPSPEC_AUTO", raising=False)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)


def _use_v2_env(monkeypatch, value: str | None) -> None:
    import vllm.envs as envs

    if value is None:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()


@pytest.mark.parametrize("method", ["ngram", "draft_copy", "eagle", "eagle3", "mtp"])
@pytest.mark.parametrize(
    ("has_triton", "use_v2", "plugin"),
    [
        (False, None, True),  # the CPU platform, as it is
        (True, None, False),  # CUDA's default: Model Runner V2
        (True, "0", True),  # CUDA, V1 asked for
        (True, "1", False),  # V2 asked for
    ],
    ids=["no-triton", "triton", "triton-v2=0", "triton-v2=1"],
)
def test_auto_selects_the_plugin_only_where_vllm_runs_v1(
    models, triton, monkeypatch, method, has_triton, use_v2, plugin
):
    triton(has_triton)
    _use_v2_env(monkeypatch, use_v2)
    target, spec = tiny_spec(models, method, 3)
    cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    worker, v2 = _served_by(cfg)
    if plugin:
        assert (worker, v2) == (WORKER_QUALNAME, False)
    else:
        assert not worker.startswith("vllm_ppspec"), worker
        assert v2 is True
        assert cfg.scheduler_config.scheduler_cls is None or not str(
            cfg.scheduler_config.scheduler_cls
        ).startswith("vllm_ppspec")


def test_v2_asked_for_without_triton_is_vllms_own_business(models, triton, monkeypatch):
    """``VLLM_USE_V2_MODEL_RUNNER=1`` on the CPU platform: vLLM 0.32 refuses it
    itself ("requires Triton"), 0.33 builds its V2 CPU runner; the plugin is out."""
    from vllm_ppspec import version_guard

    triton(False)
    _use_v2_env(monkeypatch, "1")
    target, spec = tiny_spec(models, "draft_copy", 3)
    if not version_guard.vllm_at_least("0.33.0"):
        with pytest.raises(ValueError, match="Model Runner V2 requires Triton") as e:
            _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
        assert "vllm-ppspec" not in str(e.value)
        return
    cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    worker, v2 = _served_by(cfg)
    assert not worker.startswith("vllm_ppspec") and v2 is True


def test_auto_always_takes_over_where_vllm_picks_v2(models, triton, monkeypatch):
    triton(True)
    monkeypatch.setenv("VLLM_PPSPEC_AUTO", "always")
    target, spec = tiny_spec(models, "draft_copy", 3)
    cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    assert _served_by(cfg) == (WORKER_QUALNAME, False)


def test_v2_is_left_alone_with_one_line_saying_so(models, triton, monkeypatch):
    from vllm_ppspec.patches import config as config_patches

    said: list[str] = []
    monkeypatch.setattr(config_patches, "_log_once", lambda level, msg: said.append(msg))
    triton(True)
    target, spec = tiny_spec(models, "draft_copy", 3)
    _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    assert len(said) == 1 and "Model Runner V2 serves this configuration" in said[0]


@pytest.mark.parametrize("has_triton", [False, True], ids=["no-triton", "triton"])
def test_no_pp_or_no_spec_is_vllms_own_choice(models, triton, has_triton):
    triton(has_triton)
    target, spec = tiny_spec(models, "draft_copy", 3)
    pp1 = _config(models[target], pipeline_parallel_size=1, speculative_config=spec)
    nospec = _config(models[target], pipeline_parallel_size=2)
    for cfg in (pp1, nospec):
        worker, v2 = _served_by(cfg)
        assert not worker.startswith("vllm_ppspec")
        assert v2 is has_triton


def test_a_method_the_plugin_does_not_serve_keeps_vllms_behaviour(models, triton, monkeypatch):
    """A method outside the plugin's list is vLLM's: on V1 it meets vLLM's own
    behaviour, not the plugin's refusal."""
    triton(False)
    target, spec = tiny_spec(models, "draft_copy", 3)
    spec = {**spec, "method": "suffix"}
    spec.pop("model")
    try:
        cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    except Exception as e:  # vLLM's own refusal (e.g. arctic-inference missing)
        assert "vllm-ppspec" not in str(e)
    else:
        assert not cfg.parallel_config.worker_cls.startswith("vllm_ppspec")


def test_explicit_plugin_worker_forces_v1_over_v2s_default(models, triton):
    triton(True)
    target, spec = tiny_spec(models, "draft_copy", 3)
    cfg = _config(
        models[target],
        pipeline_parallel_size=2,
        speculative_config=spec,
        worker_cls=WORKER_QUALNAME,
    )
    assert _served_by(cfg) == (WORKER_QUALNAME, False)


def test_explicit_plugin_worker_is_refused_where_v2_is_required(models, monkeypatch):
    _use_v2_env(monkeypatch, "1")
    target, spec = tiny_spec(models, "draft_copy", 3)
    with pytest.raises(ValueError, match="requires Model Runner V2: use --worker-cls auto"):
        _config(
            models[target],
            pipeline_parallel_size=2,
            speculative_config=spec,
            worker_cls=WORKER_QUALNAME,
        )


def test_watermarking_and_hisparse_are_left_to_vllms_v2(models, triton):
    """vLLM forces V2 for these whatever else is set: auto leaves them to V2
    (the V1 runner would silently drop the feature)."""
    from vllm.config.attention import HiSparseConfig

    from vllm_ppspec.patches.worker_choice import facts_of

    triton(False)
    target, spec = tiny_spec(models, "draft_copy", 3)
    cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    assert cfg.parallel_config.worker_cls == WORKER_QUALNAME
    cfg.parallel_config.worker_cls = "auto"
    cfg.attention_config.hisparse_config = HiSparseConfig()
    f = facts_of(cfg, lambda c: True)
    assert f.v2_required == "HiSparse" and decide(f).choice is Choice.VLLM_V2
    cfg.attention_config.hisparse_config = None
    cfg.watermark_config = object()  # any value: vLLM checks it is set
    f = facts_of(cfg, lambda c: True)
    assert f.v2_required == "watermarking" and decide(f).choice is Choice.VLLM_V2
