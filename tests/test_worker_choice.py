"""Who serves PP + speculative decoding (``worker_choice.py``), cell by
cell of docs/support.md's table, and through vLLM's real config path.

The CPU platform has no Triton, so vLLM runs its V1 runner here; CUDA's
default (Triton present: Model Runner V2) is simulated by setting
``vllm.config.vllm.HAS_TRITON`` to True, the one fact vLLM reads. No engine is
started: the configs are built by ``EngineArgs.create_engine_config``.
"""

from __future__ import annotations

import pytest

from vllm_ppspec import WORKER_QUALNAME
from vllm_ppspec.choice.worker import (
    SUPPORTED_PP_METHODS,
    Choice,
    Facts,
    auto_setting,
    decide,
    plugin_line,
)
from vllm_ppspec.plugin import register
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

register()

P, V1, V2, NONE, REF = Choice.PLUGIN, Choice.VLLM_V1, Choice.VLLM_V2, Choice.VLLM, Choice.REFUSED
OTHER = Choice.OTHER_PLATFORM
STOCK = "vllm.v1.worker.gpu_worker.Worker"
METHODS = SUPPORTED_PP_METHODS


def facts(**kw) -> Facts:
    base = dict(
        pp=2,
        dp=1,
        method="draft_model",
        worker_cls="auto",
        auto="on",
        v2_required=None,
        v2_by_default=False,
        platform="cpu",
    )
    return Facts(**{**base, **kw})  # type: ignore[arg-type]


# (facts, who serves): the rows of docs/support.md, "Who serves PP + speculative decoding".
TABLE = [
    # V1 is vLLM's choice (CPU, no Triton, VLLM_USE_V2_MODEL_RUNNER=0, a V2-only feature missing)
    *[(facts(method=m), P) for m in METHODS],
    # a method the plugin does not run: its worker, to refuse it naming why (unserved.py)
    *[
        (facts(method=m), P)
        for m in ("ngram_gpu", "dspark", "extract_hidden_states", "mlp_speculator")
    ],
    (facts(auto="off"), V1),
    (facts(auto="always"), P),
    # DP > 1 with spec on a MoE target (one engine across DP ranks): as under PP
    *[(facts(pp=1, dp=2, moe=True, method=m), P) for m in METHODS],
    *[(facts(pp=2, dp=2, moe=m == "mtp", method=m), P) for m in METHODS],
    (facts(pp=1, dp=2, moe=True, method="ngram_gpu"), P),
    (facts(pp=1, dp=2, moe=True, auto="off"), V1),
    (facts(pp=1, dp=2, moe=True, v2_by_default=True), V2),
    (facts(pp=1, dp=2, moe=True, v2_required="VLLM_USE_V2_MODEL_RUNNER=1"), V2),
    (facts(pp=1, dp=2, moe=True, method=None), NONE),
    # DP > 1 with spec on a dense target at PP = 1: independent DP=1 engines,
    # vLLM's own worker serves spec there
    *[(facts(pp=1, dp=2, method=m), NONE) for m in METHODS],
    (facts(pp=1, dp=2, auto="always", v2_by_default=True), NONE),
    (facts(pp=1, dp=2, worker_cls=WORKER_QUALNAME), P),  # named: as vLLM's V1 worker
    (facts(pp=1, dp=2, worker_cls=WORKER_QUALNAME, v2_by_default=True), V2),
    # V2 is vLLM's default choice (CUDA with Triton)
    *[(facts(method=m, v2_by_default=True), V2) for m in ("ngram", "draft_model", "mtp")],
    *[(facts(method=m, v2_by_default=True, auto="always"), P) for m in ("eagle3", "ngram")],
    (facts(method="dspark", v2_by_default=True, auto="always"), V2),
    (facts(v2_by_default=True, auto="off"), V2),
    # V2 is required (VLLM_USE_V2_MODEL_RUNNER=1, HiSparse, watermarking)
    *[(facts(v2_required=r), V2) for r in ("VLLM_USE_V2_MODEL_RUNNER=1", "HiSparse")],
    (facts(v2_required="watermarking", auto="always"), V2),
    (facts(v2_required="HiSparse", worker_cls=WORKER_QUALNAME), REF),
    # An explicit worker
    (facts(worker_cls=WORKER_QUALNAME, v2_by_default=True), P),
    (facts(worker_cls=WORKER_QUALNAME), P),
    (facts(worker_cls=STOCK), V1),
    (facts(worker_cls=STOCK, v2_by_default=True), V2),
    # The plugin's worker named on a line that is not PP/DP + spec: vLLM's own
    # choice of runner (V1: the plugin's worker with nothing of the plugin per
    # step; V2: vLLM's own worker), never a refusal
    (facts(pp=1, worker_cls=WORKER_QUALNAME), P),
    (facts(method=None, worker_cls=WORKER_QUALNAME), P),
    (facts(pp=1, worker_cls=WORKER_QUALNAME, v2_by_default=True), V2),
    (facts(pp=1, worker_cls=WORKER_QUALNAME, v2_required="VLLM_USE_V2_MODEL_RUNNER=1"), V2),
    # Platforms the plugin has no worker for: vLLM's own worker, any setting
    *[(facts(platform=pl), OTHER) for pl in ("xpu", "tpu", "oot")],
    (facts(platform="xpu", auto="always"), OTHER),
    (facts(platform="xpu", pp=1, dp=2, moe=True), OTHER),
    *[(facts(platform=pl, worker_cls=WORKER_QUALNAME), REF) for pl in ("xpu", "tpu")],
    (facts(platform="xpu", pp=1, worker_cls=WORKER_QUALNAME), REF),
    (facts(platform="xpu", method=None), NONE),
    # Nothing to take over
    (facts(pp=1), NONE),
    (facts(method=None), NONE),
    (facts(pp=1, v2_by_default=True, auto="always"), NONE),
]


@pytest.mark.parametrize(("f", "who"), TABLE, ids=[str(i) for i in range(len(TABLE))])
def test_each_cell_of_the_table(f, who):
    assert decide(f).choice is who, decide(f).why


# docs/support.md's "Who serves" table, row by row: (platform, runner vLLM
# picks, --worker-cls, line), as written there -> the facts of the configs the
# row stands for. Each row's "who serves" must be what decide says for every
# one of them (_serves_as_written).
UNSERVED = ("ngram_gpu", "dspark", "extract_hidden_states", "mlp_speculator")
V1_KEPT = ("medusa", "custom_class", "suffix", "eagle3", "draft_model")  # + P-EAGLE, PARD, vocab
PLUGIN_LINES = [dict(pp=2), dict(pp=3), dict(pp=1, dp=2, moe=True), dict(pp=2, dp=2)]
OFF_LINES = [
    dict(pp=1),
    dict(method=None),
    dict(pp=1, dp=2),
    dict(pp=1, dp=2, moe=True, method=None),
]
ANY_LINE = PLUGIN_LINES + OFF_LINES
ANY_PLATFORM = ("cpu", "cuda", "xpu", "tpu", "oot")
REQUIRED = [dict(v2_required=r) for r in ("VLLM_USE_V2_MODEL_RUNNER=1", "HiSparse", "watermarking")]
ANY_RUNNER = [dict(), dict(v2_by_default=True), *REQUIRED]


def _cases(platforms, runners, workers, lines, methods, **extra) -> list[Facts]:
    return [
        facts(**{"method": m, **line, **runner, "platform": pl, "worker_cls": w, **extra})
        for pl in platforms
        for runner in runners
        for w in workers
        for line in lines
        for m in methods
    ]


AUTO, NAMED = ["auto"], [WORKER_QUALNAME]
DOC_ROWS = {
    ("CPU (no Triton)", "V1", "auto", "a plugin line (PP > 1, or DP > 1 on a MoE target) with a "
     "method of `SUPPORTED_PP_METHODS`"): _cases(["cpu"], [{}], AUTO, PLUGIN_LINES, METHODS),
    ("CPU or CUDA", "V1", "auto", "a plugin line, any other method (ngram_gpu, dspark, "
     "extract_hidden_states, mlp_speculator)"):
        _cases(["cpu", "cuda"], [{}], AUTO, PLUGIN_LINES, UNSERVED),
    ("CUDA, Triton (default)", "V1 (vLLM keeps V1 for medusa, custom_class, suffix, P-EAGLE, "
     "PARD, other-vocabulary drafts)", "auto", "a plugin line"):
        _cases(["cuda"], [{}], AUTO, PLUGIN_LINES, V1_KEPT),
    ("any", "any", "auto", "DP > 1 at PP = 1 on a dense target, with spec"):
        _cases(ANY_PLATFORM, ANY_RUNNER, AUTO, [dict(pp=1, dp=2)], METHODS + UNSERVED),
    ("CUDA, Triton (default)", "V2", "auto", "a plugin line, any method"):
        _cases(["cuda"], [dict(v2_by_default=True)], AUTO, PLUGIN_LINES, METHODS + UNSERVED),
    ("CUDA, Triton, `VLLM_PPSPEC_AUTO=always`", "V2", "auto",
     "a plugin line + the plugin's methods"):
        _cases(["cuda"], [dict(v2_by_default=True)], AUTO, PLUGIN_LINES, METHODS, auto="always"),
    ("CUDA, `VLLM_USE_V2_MODEL_RUNNER=0`, or no Triton", "V1", "auto",
     "a plugin line + the plugin's methods"): _cases(["cuda"], [{}], AUTO, PLUGIN_LINES, METHODS),
    ("CPU or CUDA, `VLLM_USE_V2_MODEL_RUNNER=1`, HiSparse or watermarking", "V2 (required)",
     "auto", "any"):
        _cases(["cpu", "cuda"], REQUIRED, AUTO, ANY_LINE, METHODS + UNSERVED)
        + _cases(["cpu", "cuda"], REQUIRED, AUTO, ANY_LINE, METHODS, auto="always"),
    ("CPU or CUDA", "required V2", "the plugin's", "a plugin line"):
        _cases(["cpu", "cuda"], REQUIRED, NAMED, PLUGIN_LINES, METHODS + UNSERVED),
    ("CPU or CUDA", "V1 or V2 by default", "the plugin's", "a plugin line + the plugin's methods"):
        _cases(["cpu", "cuda"], [{}, dict(v2_by_default=True)], NAMED, PLUGIN_LINES, METHODS),
    ("CPU or CUDA", "V1 or V2 by default", "the plugin's", "a plugin line + any other method"):
        _cases(["cpu", "cuda"], [{}, dict(v2_by_default=True)], NAMED, PLUGIN_LINES, UNSERVED),
    ("CPU or CUDA", "V1", "the plugin's",
     "not a plugin line (PP = 1 without MoE DP, or no spec)"):
        _cases(["cpu", "cuda"], [{}], NAMED, OFF_LINES, METHODS),
    ("CPU or CUDA", "V2 (default or required)", "the plugin's", "not a plugin line"):
        _cases(["cpu", "cuda"], [dict(v2_by_default=True), *REQUIRED], NAMED, OFF_LINES, METHODS),
    ("XPU, TPU, out-of-tree", "any", "auto", "any"):
        _cases(["xpu", "tpu", "oot"], ANY_RUNNER, AUTO, ANY_LINE, METHODS + UNSERVED)
        + _cases(["xpu"], ANY_RUNNER, AUTO, ANY_LINE, METHODS, auto="always"),
    ("XPU, TPU, out-of-tree", "any", "the plugin's", "any"):
        _cases(["xpu", "tpu", "oot"], ANY_RUNNER, NAMED, ANY_LINE, METHODS + UNSERVED),
    ("any", "any", "another worker", "any"):
        _cases(ANY_PLATFORM, ANY_RUNNER, [STOCK, "my_package.MyWorker"], ANY_LINE, METHODS),
    ("any", "any", "auto, `VLLM_PPSPEC_AUTO=0`", "any"):
        _cases(ANY_PLATFORM, ANY_RUNNER, AUTO, ANY_LINE, METHODS + UNSERVED, auto="off"),
    ("any", "any", "auto", "PP = DP = 1, or no spec"):
        _cases(ANY_PLATFORM, ANY_RUNNER, AUTO, [dict(pp=1), *[
            dict(line, method=None) for line in PLUGIN_LINES]], METHODS)
        + _cases(ANY_PLATFORM, ANY_RUNNER, AUTO, [dict(pp=1)], METHODS, auto="always"),
}  # fmt: skip


def _serves_as_written(who: str, f: Facts) -> bool:
    """Whether ``decide(f)`` is what a row's "who serves" cell says. Where the
    plugin's worker is selected for a method it does not run, it refuses the
    config when it is built (patches/config/refusals.py, tests/test_unserved.py)."""
    d = decide(f)
    by_its_worker = (
        d.choice is P
        and plugin_line(f.pp, f.dp, f.method, f.moe)
        and f.method not in SUPPORTED_PP_METHODS
    )
    if who == "**refused** by the plugin's worker":
        return by_its_worker
    if who == "**refused**":
        return d.choice is REF or by_its_worker
    if who in (
        "**the plugin**",
        "**the plugin** (V1)",
        "**the plugin** (V1 forced)",
        "the plugin's worker, as vLLM's V1 worker (mode off)",
    ):
        return d.choice is P and not by_its_worker
    if who in ("vLLM, V2", "vLLM, V2 (its own worker)"):
        # Off the plugin's lines vLLM's own choice, which is V2 here.
        return d.choice is V2 or (d.choice is NONE and bool(f.v2_required or f.v2_by_default))
    if who == "vLLM":  # vLLM's own worker, whichever runner it picks
        return d.choice in (V1, V2, NONE, OTHER)
    raise AssertionError(f"a 'who serves' cell this test does not know: {who!r}")


def _docs_who_serves_rows() -> list[list[str]]:
    """The rows of docs/support.md's "Who serves PP + speculative decoding"
    table, each a list of its cells."""
    from tests.conftest import REPO

    support = (REPO / "docs" / "support.md").read_text()
    section = support.split("## Who serves PP + speculative decoding", 1)[1]
    header = "| platform | runner vLLM picks | `--worker-cls` | line | who serves | why |"
    lines = section.split(header, 1)[1].splitlines()[2:]  # after the |---| line
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_every_row_of_the_docs_table_is_what_decide_says():
    """docs/support.md's "Who serves" table, every row: its conditions are the
    ones listed here, and for each config they stand for, ``decide`` gives
    what its "who serves" cell says. README carries one line of it."""
    from tests.conftest import REPO

    rows = _docs_who_serves_rows()
    assert all(len(row) == 6 for row in rows), rows
    written = [tuple(row[:4]) for row in rows]
    assert len(set(written)) == len(written), written
    assert set(written) - set(DOC_ROWS) == set(), "rows this test does not know"
    assert set(DOC_ROWS) - set(written) == set(), "rows the docs no longer have"
    for row in rows:
        cases = DOC_ROWS[tuple(row[:4])]
        assert cases, row
        wrong = [(f, decide(f)) for f in cases if not _serves_as_written(row[4], f)]
        assert not wrong, (row[:5], wrong[:3], len(wrong))
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

    kwargs.setdefault("dtype", "float32")
    return EngineArgs(model=model, max_model_len=256, **kwargs).create_engine_config()


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


# A tiny speculative config per method, on a dense target and on a MoE one:
# (target fixture, drafter of tiny_spec or None for a config without a drafter).
DENSE_SPECS = {
    "ngram": "ngram",
    "draft_model": "draft_copy",
    "eagle": "eagle",
    "eagle3": "eagle3_succ",
    "mtp": "mtp",
}
MOE_SPECS = {
    "ngram": ("moe", "ngram"),
    "draft_model": ("moe", "moe_copy"),
    "eagle": ("moe", "eagle"),
    "eagle3": ("moe", "eagle3_succ"),
    "mtp": ("hybrid_copy", None),  # tiny Qwen3-Next: every MLP a MoE, an MTP layer
}


# Methods for which vLLM 0.32/0.33 keep the V1 runner even where V2 is the
# default (VllmConfig._get_v2_model_runner_unsupported_features).
V1_ONLY = ("medusa", "custom_class", "suffix")


def _v1_only_spec(models, method: str) -> dict:
    from tests.conftest import MODELS_DIR
    from vllm_ppspec_tools.fixtures.method_drafters import build_method_drafters

    spec: dict = {"method": method, "num_speculative_tokens": 3}
    if method == "medusa":
        spec["model"] = build_method_drafters(MODELS_DIR, models)["medusa_succ"]
    elif method == "custom_class":
        spec["model"] = "vllm_ppspec_tools.fixtures.succ_proposer.SuccProposer"
    return spec


def spec_line(models, method: str, moe: bool) -> tuple[str, dict, dict]:
    """(target path, speculative config, other EngineArgs) for ``method``."""
    if method in V1_ONLY:
        return models["moe" if moe else "target"], _v1_only_spec(models, method), {}
    if method == "dflash":
        from tests.conftest import MODELS_DIR
        from vllm_ppspec_tools.fixtures.method_drafters import build_method_drafters

        drafter = build_method_drafters(MODELS_DIR, models)["dflash_aux"]
        spec = {"method": method, "model": drafter, "num_speculative_tokens": 3}
        return models["moe" if moe else "target"], spec, {}
    if method not in DENSE_SPECS:
        pytest.fail(
            f"no tiny config for method {method!r} (in SUPPORTED_PP_METHODS) here: add it "
            "to DENSE_SPECS and MOE_SPECS"
        )
    if not moe:
        target, spec = tiny_spec(models, DENSE_SPECS[method], 3)
        return models[target], spec, {}
    target, drafter = MOE_SPECS[method]
    if drafter is None:
        from tests.conftest import MODELS_DIR
        from vllm_ppspec_tools.fixtures.tiny_hybrid import build_hybrid

        path = build_hybrid(MODELS_DIR)[target]
        spec = {"method": method, "num_speculative_tokens": 3}
        return path, spec, {"dtype": "bfloat16", "enable_prefix_caching": False}
    _, spec = tiny_spec(models, drafter, 3)
    return models[target], spec, {}


RUNNERS = [
    (False, None, True),  # the CPU platform, as it is
    (True, None, False),  # CUDA's default: Model Runner V2
    (True, "0", True),  # CUDA, V1 asked for
    (True, "1", False),  # V2 asked for
]
RUNNER_IDS = ["no-triton", "triton", "triton-v2=0", "triton-v2=1"]
# (DP, PP, MoE target, whether the line is the plugin's)
SHAPES = [
    (1, 2, False, True),
    (2, 1, False, False),  # dense DP: independent DP=1 engines, vLLM's own worker
    (2, 1, True, True),
    (2, 2, False, True),
    (2, 2, True, True),
]
SHAPE_IDS = ["pp2", "dp2-dense", "dp2-moe", "dp2xpp2-dense", "dp2xpp2-moe"]


def _this_vllms(methods) -> list[str]:
    """The methods this vLLM runs (0.33 removed medusa)."""
    from tests.test_unserved import vllm_methods

    return [m for m in methods if m in vllm_methods()]


@pytest.mark.parametrize("method", _this_vllms(SUPPORTED_PP_METHODS))
@pytest.mark.parametrize(("dp", "pp", "moe", "line"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize(("has_triton", "use_v2", "runner_v1"), RUNNERS, ids=RUNNER_IDS)
def test_auto_selects_the_plugin_only_where_vllm_runs_v1(
    models, triton, monkeypatch, method, dp, pp, moe, line, has_triton, use_v2, runner_v1
):
    """Every cell of the table through ``EngineArgs``: speculative decoding with
    PP=2, DP=2 (PP=1) and DP=2 x PP=2 on a dense and a MoE target, each method,
    each runner condition. The plugin's worker only where the line is the
    plugin's and vLLM runs V1; elsewhere vLLM's own choice, untouched, and the
    config's plan (who serves, the mode) and the refusals agree."""
    from vllm_ppspec.choice.plan import plan_of
    from vllm_ppspec.choice.policy import Mode
    from vllm_ppspec.patches.config.refusals import pp_spec_unsupported

    triton(has_triton)
    _use_v2_env(monkeypatch, use_v2)
    target, spec, extra = spec_line(models, method, moe)
    shape = dict(pipeline_parallel_size=pp, data_parallel_size=dp, speculative_config=spec)
    if method in V1_ONLY and use_v2 == "1":
        # V2 asked for a method only V1 runs: vLLM's own refusal, whoever serves.
        with pytest.raises(ValueError, match="Model Runner V2 does not yet support") as e:
            _config(target, **shape, **extra)
        assert "vllm-ppspec" not in str(e.value)
        return
    cfg = _config(target, **shape, **extra)
    worker, v2 = _served_by(cfg)
    if method in V1_ONLY:
        runner_v1 = True  # vLLM keeps V1 for it, Triton or not
    plugin = line and runner_v1
    assert plan_of(cfg).acts is plugin
    assert plan_of(cfg).mode is (Mode.OFF if not plugin or pp == 1 else Mode.SYNC)
    assert pp_spec_unsupported(cfg) == []
    if plugin:
        assert (worker, v2) == (WORKER_QUALNAME, False)
    else:
        assert not worker.startswith("vllm_ppspec"), worker
        assert v2 is (not runner_v1)
        assert cfg.scheduler_config.scheduler_cls is None or not str(
            cfg.scheduler_config.scheduler_cls
        ).startswith("vllm_ppspec")


# The drafter features vLLM 0.32's Model Runner V2 does not run
# (VllmConfig._get_v2_model_runner_unsupported_features): vLLM keeps V1 for
# them, Triton or not, and the plugin serves them (docs/support.md, "Who
# serves"). Each with the same method without the feature, which V2 serves.
V1_FEATURES = {
    "peagle": (
        {"method": "eagle3", "model": "peagle_succ", "parallel_drafting": True},
        {"method": "eagle3", "model": "peagle_succ"},
    ),
    "pard": (
        {"method": "draft_model", "model": "pard_copy", "parallel_drafting": True},
        {"method": "draft_model", "model": "pard_copy"},
    ),
    "other_vocab": (  # without the mapping vLLM refuses a draft of another vocabulary size
        {"method": "draft_model", "model": "draft_vocab", "use_heterogeneous_vocab": True},
        {"method": "draft_model", "model": "draft_copy"},
    ),
}


@pytest.mark.parametrize("feature", list(V1_FEATURES))
def test_under_triton_vllm_keeps_v1_for_peagle_pard_and_another_vocabulary_and_the_plugin_serves(
    models, triton, feature
):
    """P-EAGLE, PARD and a draft model with another vocabulary at PP=2 with
    Triton (CUDA's default): the plugin's worker on V1. The same method
    without the feature goes to V2: the feature is what keeps V1."""
    from tests.conftest import MODELS_DIR
    from vllm_ppspec_tools.fixtures.method_drafters import build_method_drafters

    drafters = {**build_method_drafters(MODELS_DIR, models), "draft_copy": models["draft_copy"]}
    triton(True)
    served = {}
    for name, spec in zip(("feature", "plain"), V1_FEATURES[feature], strict=True):
        spec = {**spec, "model": drafters[spec["model"]], "num_speculative_tokens": 3}
        cfg = _config(models["target"], pipeline_parallel_size=2, speculative_config=spec)
        served[name] = _served_by(cfg)
    assert served["feature"] == (WORKER_QUALNAME, False)
    worker, v2 = served["plain"]
    assert not worker.startswith("vllm_ppspec") and v2 is True, worker


@pytest.mark.parametrize("has_triton", [False, True], ids=["no-triton", "triton"])
def test_suffix_with_async_scheduling_is_vllms_refusal(models, triton, has_triton):
    """vLLM runs async scheduling only with the EAGLE, MTP, draft-model,
    ngram_gpu, DSpark and DFlash proposers: suffix decoding with
    --async-scheduling at PP=2 gets vLLM's own refusal, Triton or not; with
    sync scheduling the plugin's worker serves it."""
    triton(has_triton)
    spec = _v1_only_spec(models, "suffix")
    from vllm_ppspec.compat.guard import installed_vllm_version

    refused = {
        "0.32.0": r"async scheduling is only supported with EAGLE/MTP",
        "0.33.0": r"Async scheduling is not supported by the V1 model runner with suffix",
    }[installed_vllm_version()]
    with pytest.raises(ValueError, match=refused) as e:
        _config(
            models["target"],
            pipeline_parallel_size=2,
            speculative_config=spec,
            async_scheduling=True,
        )
    assert "vllm-ppspec" not in str(e.value)
    sync = _config(models["target"], pipeline_parallel_size=2, speculative_config=spec)
    assert _served_by(sync) == (WORKER_QUALNAME, False)


def test_v2_asked_for_without_triton_is_vllms_own_business(models, triton, monkeypatch):
    """``VLLM_USE_V2_MODEL_RUNNER=1`` on the CPU platform: vLLM 0.32 refuses it
    itself ("requires Triton"), 0.33 builds its V2 CPU runner; the plugin is out."""
    from vllm_ppspec.compat import guard as version_guard

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
    from vllm_ppspec.patches.config import selection as config_patches

    said: list[str] = []
    monkeypatch.setattr(config_patches, "_log_once", lambda level, msg: said.append(msg))
    triton(True)
    target, spec = tiny_spec(models, "draft_copy", 3)
    _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    assert len(said) == 1 and "Model Runner V2 serves this configuration" in said[0]


def test_where_vllm_picks_v2_the_plugins_switches_and_defaults_are_not_read(
    models, triton, monkeypatch
):
    """The drafter stage's default (auto) and every other switch belong to the
    plugin's V1 lines: where vLLM picks Model Runner V2 (CUDA with Triton) the
    plan is off, the first stage never drafts and no switch is read, so even a
    value the plugin would refuse builds the config as vLLM's."""
    from vllm_ppspec.choice.plan import PLAN_KEY, plan_of
    from vllm_ppspec.choice.policy import Mode

    triton(True)
    monkeypatch.setenv("VLLM_PPSPEC_DRAFTER_STAGE", "middle")
    monkeypatch.setenv("VLLM_PPSPEC_LAYER_SPLIT", "fastest")
    target, spec = tiny_spec(models, "draft_copy", 3)
    cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    assert _served_by(cfg)[1] is True
    plan = plan_of(cfg)
    assert plan.mode is Mode.OFF and not plan.drafter_first and plan.drafter_why == ""
    # The plan kept on the config (a line the plugin serves elsewhere) says so.
    assert cfg.additional_config[PLAN_KEY]["worker"] is False
    assert cfg.additional_config[PLAN_KEY]["mode"] == "OFF"


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


@pytest.mark.parametrize("pp", [2, 3])
def test_a_method_the_plugin_does_not_run_is_refused_naming_why_on_the_plain_line(
    models, triton, pp
):
    """Where vLLM runs V1 and its own worker would fail at start-up under PP, a
    method the plugin does not run is refused at config time, naming why and
    what to run instead (unserved.py), with no --worker-cls."""
    triton(False)
    spec = {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    with pytest.raises(ValueError) as e:
        _config(models["target"], pipeline_parallel_size=pp, speculative_config=spec)
    message = str(e.value)
    assert "speculative method 'ngram_gpu' with pipeline parallelism" in message, message
    assert "CUDA buffers and events" in message and "use method 'ngram'" in message, message


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

    from vllm_ppspec.choice.worker import facts_of

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


# ---------------------------------------------------------------------------
# VLLM_PPSPEC_AUTO's values.
# ---------------------------------------------------------------------------


def _pp2_spec(models, monkeypatch, auto: str):
    monkeypatch.setenv("VLLM_PPSPEC_AUTO", auto)
    target, spec = tiny_spec(models, "draft_copy", 3)
    return _config(models[target], pipeline_parallel_size=2, speculative_config=spec)


@pytest.mark.parametrize("value", ["0", "false", "OFF", "No"])
def test_auto_off_values_keep_vllms_worker(models, triton, monkeypatch, value):
    triton(False)
    worker, v2 = _served_by(_pp2_spec(models, monkeypatch, value))
    assert not worker.startswith("vllm_ppspec") and v2 is False, worker


@pytest.mark.parametrize("value", ["1", "true", "ON", "Yes", ""])
def test_auto_on_values_select_as_the_rule_says(models, triton, monkeypatch, value):
    triton(False)
    assert _served_by(_pp2_spec(models, monkeypatch, value)) == (WORKER_QUALNAME, False)


@pytest.mark.parametrize("value", ["sometimes", "2", "enable"])
def test_other_auto_values_are_refused_at_config_time_naming_the_values(
    models, triton, monkeypatch, value
):
    triton(False)
    with pytest.raises(ValueError, match=f"VLLM_PPSPEC_AUTO='{value}' is not a value it takes"):
        _pp2_spec(models, monkeypatch, value)
    with pytest.raises(ValueError, match="0, false, off or no keep vLLM's own worker"):
        auto_setting(value)


@pytest.mark.parametrize(
    "line",
    [
        dict(pipeline_parallel_size=1),
        dict(pipeline_parallel_size=2),
        dict(pipeline_parallel_size=1, spec=True),
        dict(pipeline_parallel_size=1, data_parallel_size=2, spec=True),
        dict(pipeline_parallel_size=2, spec=True, worker_cls=WORKER_QUALNAME),
    ],
    ids=["pp1", "pp2-no-spec", "pp1-spec", "dense-dp2-spec", "named-worker"],
)
def test_an_unknown_auto_value_is_not_read_where_the_plugin_cannot_act(
    models, triton, monkeypatch, notices, line
):
    """Off the plugin's lines (and with its worker named) VLLM_PPSPEC_AUTO
    changes nothing: any value builds the config as without the plugin, with
    no log line from the plugin."""
    triton(False)
    monkeypatch.setenv("VLLM_PPSPEC_AUTO", "sometimes")
    line = dict(line)
    target, spec = tiny_spec(models, "draft_copy", 3)
    if line.pop("spec", False) or "worker_cls" in line:
        line["speculative_config"] = spec
    cfg = _config(models[target], **line)
    named = "worker_cls" in line
    assert cfg.parallel_config.worker_cls.startswith("vllm_ppspec") is named
    assert notices == []


def test_a_dense_dp_line_with_spec_is_vllms_with_no_plugin_line(models, triton, notices):
    """Dense DP runs independent DP=1 engines (vLLM's EngineCoreProc): vLLM's
    own worker serves spec there, the plugin says nothing, on V1 and V2."""
    for has_triton in (False, True):
        triton(has_triton)
        target, spec = tiny_spec(models, "draft_copy", 3)
        cfg = _config(models[target], data_parallel_size=2, speculative_config=spec)
        assert not cfg.parallel_config.worker_cls.startswith("vllm_ppspec")
        assert bool(cfg.use_v2_model_runner) is has_triton
    assert notices == []


# ---------------------------------------------------------------------------
# Platforms: vLLM's platform object replaced by a stand-in of each kind.
# ---------------------------------------------------------------------------


class _Platform:
    """A stand-in for vLLM's platform object (what worker_choice reads of it)."""

    def __init__(self, name: str):
        self.device_name = name

    def is_cpu(self) -> bool:
        return self.device_name == "cpu"

    def is_cuda(self) -> bool:
        return self.device_name == "cuda"


@pytest.fixture
def pp2_config(models, triton):
    """A PP=2 + spec config built on the CPU platform, its worker back at ``auto``."""
    triton(False)
    target, spec = tiny_spec(models, "draft_copy", 3)
    cfg = _config(models[target], pipeline_parallel_size=2, speculative_config=spec)
    cfg.parallel_config.worker_cls = "auto"
    return cfg


@pytest.fixture
def notices(monkeypatch):
    from vllm_ppspec.patches.config import selection as config_patches

    said: list[tuple[str, str]] = []
    monkeypatch.setattr(config_patches, "_log_once", lambda level, msg: said.append((level, msg)))
    return said


@pytest.mark.parametrize("name", ["xpu", "tpu", "my_oot_device"])
def test_on_another_platform_auto_leaves_vllms_worker_with_one_info_line(
    pp2_config, notices, monkeypatch, name
):
    import vllm.platforms

    from vllm_ppspec.patches.config.selection import select_worker

    monkeypatch.setattr(vllm.platforms, "_current_platform", _Platform(name))
    assert select_worker(pp2_config).choice is Choice.OTHER_PLATFORM
    assert pp2_config.parallel_config.worker_cls == "auto"
    assert len(notices) == 1 and notices[0][0] == "info", notices
    assert "vLLM's own worker serves" in notices[0][1] and f"the {name} platform" in notices[0][1]


@pytest.mark.parametrize("name", ["xpu", "tpu", "my_oot_device"])
def test_on_another_platform_the_plugins_worker_named_is_refused_naming_it(
    pp2_config, monkeypatch, name
):
    import vllm.platforms

    from vllm_ppspec.patches.config.selection import select_worker

    monkeypatch.setattr(vllm.platforms, "_current_platform", _Platform(name))
    pp2_config.parallel_config.worker_cls = WORKER_QUALNAME
    with pytest.raises(ValueError, match=f"has no worker for vLLM's {name} platform"):
        select_worker(pp2_config)


@pytest.mark.parametrize("name", ["cpu", "cuda"])
def test_on_cpu_and_cuda_auto_selects_the_plugin_where_vllm_runs_v1(
    pp2_config, notices, monkeypatch, name
):
    import vllm.platforms

    from vllm_ppspec.patches.config.selection import select_worker

    monkeypatch.setattr(vllm.platforms, "_current_platform", _Platform(name))
    assert select_worker(pp2_config).choice is Choice.PLUGIN
    assert pp2_config.parallel_config.worker_cls == WORKER_QUALNAME


# ---------------------------------------------------------------------------
# The plugin's worker named on a line that is not PP/DP + speculative decoding.
# ---------------------------------------------------------------------------


def test_the_plugins_worker_named_where_vllm_picks_v2_off_pp_and_dp_is_vllms_own(
    models, triton, monkeypatch
):
    """No forced V1 and no refusal: vLLM's own worker and its V2 serve, as
    without the plugin (CUDA's default, and VLLM_USE_V2_MODEL_RUNNER=1)."""
    triton(True)
    target, spec = tiny_spec(models, "draft_copy", 3)
    lines = [
        dict(pipeline_parallel_size=1, speculative_config=spec),
        dict(pipeline_parallel_size=2),
    ]
    for use_v2 in (None, "1"):
        _use_v2_env(monkeypatch, use_v2)
        for line in lines:
            worker, v2 = _served_by(_config(models[target], worker_cls=WORKER_QUALNAME, **line))
            assert not worker.startswith("vllm_ppspec") and v2 is True, (use_v2, line, worker)


def test_the_plugins_worker_named_where_vllm_runs_v1_off_pp_and_dp_serves_as_vllms(models, triton):
    """On V1 (the CPU platform) it serves, with vLLM's scheduler and nothing of
    the plugin per step (its mode is off)."""
    from vllm_ppspec.choice.plan import plan_of
    from vllm_ppspec.choice.policy import Mode

    triton(False)
    target, spec = tiny_spec(models, "draft_copy", 3)
    cfg = _config(
        models[target],
        pipeline_parallel_size=1,
        speculative_config=spec,
        worker_cls=WORKER_QUALNAME,
    )
    assert _served_by(cfg) == (WORKER_QUALNAME, False)
    assert plan_of(cfg).mode is Mode.OFF
    sched = cfg.scheduler_config.scheduler_cls
    assert sched is None or not str(sched).startswith("vllm_ppspec"), sched
