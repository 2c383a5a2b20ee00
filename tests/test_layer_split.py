"""The target's layer split the plugin chooses under PP + spec (layer_split.py).

Configs of the tiny models are built through ``EngineArgs``, as a user's line
is; the bench and SmolLM2 shapes are stand-ins with their real sizes. Which
layers each rank then holds is checked on real engines by
tests/test_e2e_pp_spec.py (``probe_target_layers``).
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from vllm_ppspec.choice import layer_split
from vllm_ppspec.choice.layer_split import Stages, choose, estimate
from vllm_ppspec.choice.policy import SPLIT_ENV
from vllm_ppspec_tools.fixtures.spec_configs import tiny_spec

PLUGIN = "vllm_ppspec.worker.PPSpecWorker"


@pytest.fixture(autouse=True)
def _no_split_set(monkeypatch):
    # Set first, so that monkeypatch restores the variable (unset) after the
    # test: apply() sets it, and an engine started later in this process (an
    # e2e test in the same run) would take that split for the user's.
    monkeypatch.setenv(SPLIT_ENV, "")
    monkeypatch.delenv(SPLIT_ENV)
    monkeypatch.delenv("VLLM_PPSPEC_AUTO", raising=False)
    monkeypatch.setattr(layer_split, "_set_here", None)


def _config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("distributed_executor_backend", "mp")
    return EngineArgs(model=model, max_model_len=256, **kwargs).create_engine_config()


def _tiny(models, drafter: str, pp: int = 2, **kwargs):
    target, spec = tiny_spec(models, drafter, 3)
    return _config(models[target], pipeline_parallel_size=pp, speculative_config=spec, **kwargs)


def _llama(hidden, layers, inter, heads, kv_heads, vocab):
    return SimpleNamespace(
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        vocab_size=vocab,
    )


def _stand_in(target, spec_method: str, draft=None, pp: int = 2, k: int = 3, device="cpu"):
    """The attributes layer_split reads of a VllmConfig."""
    return SimpleNamespace(
        device_config=SimpleNamespace(device_type=device),
        model_config=SimpleNamespace(
            hf_text_config=target,
            is_hybrid=False,
            is_attention_free=False,
            is_multimodal_model=False,
            get_total_num_hidden_layers=lambda: target.num_hidden_layers,
        ),
        parallel_config=SimpleNamespace(
            pipeline_parallel_size=pp, data_parallel_size=1, worker_cls=PLUGIN
        ),
        speculative_config=SimpleNamespace(
            method=spec_method,
            num_speculative_tokens=k,
            draft_model_config=None if draft is None else SimpleNamespace(hf_text_config=draft),
        ),
    )


# The planted bench target (fixtures/bench_model.py) and its one-layer drafter.
PLANTED = _llama(1024, 8, 2816, 16, 16, 512)
PLANTED_DRAFTER = _llama(1024, 1, 2816, 16, 16, 512)
# SmolLM2-135M: its LM head (tied to the embedding) weighs as much as 8 layers.
SMOLLM2 = _llama(576, 30, 1536, 9, 3, 49152)


def test_a_model_drafter_moves_target_layers_off_the_last_stage():
    """The bench's draft_model case: measured best at 5,3 by hand before
    (docs/measurements.md). The estimate gives the drafter's 3 passes 3.2
    layers' work (measured about 3.5): the work alone would split 6,2, but the
    first stage would then hold more weights than either stage of 4,4."""
    assert layer_split.split_for(_stand_in(PLANTED, "draft_model", PLANTED_DRAFTER)) == (
        [5, 3],
        [4, 4],
    )
    stand_in = _stand_in(PLANTED, "draft_model", PLANTED_DRAFTER)
    assert layer_split.split_for(stand_in, weight_limit=False) == ([6, 2], [4, 4])


def test_without_a_model_drafter_a_light_head_keeps_the_even_split():
    assert layer_split.split_for(_stand_in(PLANTED, "ngram")) == ([4, 4], [4, 4])


def test_no_stage_holds_more_weights_than_the_heaviest_of_the_even_split():
    """SmolLM2 + ngram: the LM head is 8 layers' work on the last stage, but the
    first stage holds the embedding, as heavy: moving a layer would make it the
    heaviest stage, so the even split stays (a model that fits evenly still fits)."""
    stages = estimate(_stand_in(SMOLLM2, "ngram"))
    assert stages is not None and stages.last_work == pytest.approx(8.0 * stages.layer_work)
    assert layer_split.split_for(_stand_in(SMOLLM2, "ngram")) == ([15, 15], [15, 15])
    # The work alone would move 4 layers; the log names that split for the user.
    assert layer_split.split_for(_stand_in(SMOLLM2, "ngram"), weight_limit=False) == (
        [19, 11],
        [15, 15],
    )
    # At PP=3 the middle stage holds neither: it takes a layer of the last.
    assert layer_split.split_for(_stand_in(SMOLLM2, "ngram", pp=3)) == (
        [10, 11, 9],
        [10, 10, 10],
    )


def test_choose_minimises_the_busiest_stage_within_the_weight_limit():
    stages = Stages(
        layer_work=1.0, layer_weights=1.0, last_work=2.0, last_weights=0.0, first_weights=0.0
    )
    # Weights equal per layer: nothing may grow past the even split's 5.
    assert choose(10, 2, stages, [5, 5]) == [5, 5]
    light = Stages(
        layer_work=1.0, layer_weights=1.0, last_work=2.0, last_weights=2.0, first_weights=0.0
    )
    # The last stage's 2 extra weights let one layer move (6 = 5 + 1 ... 4 + 2).
    assert choose(10, 2, light, [5, 5]) == [6, 4]
    # Ties go to the split nearest vLLM's: 5,5 and 6,4 both have 6 on their
    # busiest stage; 5,5 is vLLM's.
    flat = Stages(
        layer_work=1.0, layer_weights=0.0, last_work=1.0, last_weights=0.0, first_weights=0.0
    )
    assert choose(10, 2, flat, [5, 5]) == [5, 5]
    assert choose(9, 2, flat, [5, 4]) == [5, 4]
    # A tie between two moved splits: 6,4 and 7,3 both have 7 on their busiest
    # stage (5,5 has 8); 6,4 is nearer 5,5 (and comes after 7,3 among the
    # candidates, so the first found would be 7,3).
    steep = Stages(
        layer_work=1.0, layer_weights=0.0, last_work=3.0, last_weights=0.0, first_weights=0.0
    )
    assert choose(10, 2, steep, [5, 5]) == [6, 4]


def test_targets_the_estimate_does_not_cover_keep_vllms_split():
    hybrid = _stand_in(PLANTED, "draft_model", PLANTED_DRAFTER)
    hybrid.model_config.is_hybrid = True
    assert estimate(hybrid) is None and layer_split.split_for(hybrid) is None
    missing = _llama(1024, 8, 2816, 16, 16, 512)
    del missing.intermediate_size
    assert estimate(_stand_in(missing, "ngram")) is None


def test_tiny_model_drafters_get_the_split_the_e2e_tests_check(models):
    for drafter in ("draft_copy", "eagle3", "eagle", "mtp"):
        assert layer_split.split_for(_tiny(models, drafter)) == ([3, 1], [2, 2]), drafter
    assert layer_split.split_for(_tiny(models, "ngram")) == ([2, 2], [2, 2])


@pytest.fixture
def split_log(caplog):
    """The records of the logger the split is logged to: vLLM's ``vllm``
    hierarchy, which does not propagate to pytest's root handler once vLLM set
    up its logging."""
    log = logging.getLogger("vllm.ppspec")
    level = log.level
    log.addHandler(caplog.handler)
    log.setLevel(logging.INFO)
    yield caplog
    log.removeHandler(caplog.handler)
    log.setLevel(level)


def test_the_plugins_worker_sets_the_split_on_its_lines(models, split_log):
    """V1, CPU and CUDA alike: the plugin's workers call apply (below)."""
    cfg = _tiny(models, "draft_copy", worker_cls=PLUGIN)
    assert layer_split.apply(cfg) == "3,1"
    assert os.environ[SPLIT_ENV] == "3,1"
    assert "target layers split 3,1 over 2 PP stages instead of vLLM's 2,2" in split_log.text


def test_a_split_held_back_by_the_weight_limit_is_named_in_the_log(split_log):
    layer_split.apply(_stand_in(SMOLLM2, "ngram"))
    assert SPLIT_ENV not in os.environ
    assert "the work alone would split 19,11" in split_log.text
    assert f"set {SPLIT_ENV}=19,11 where that fits" in split_log.text


def test_the_users_split_always_wins(models, monkeypatch):
    monkeypatch.setenv(SPLIT_ENV, "1,3")
    assert layer_split.apply(_tiny(models, "draft_copy", worker_cls=PLUGIN)) == "1,3"
    assert os.environ[SPLIT_ENV] == "1,3"


def test_a_later_config_in_the_same_process_recomputes_the_plugins_own_split(models):
    assert layer_split.apply(_tiny(models, "draft_copy", worker_cls=PLUGIN)) == "3,1"
    assert layer_split.apply(_tiny(models, "ngram", worker_cls=PLUGIN)) is None
    assert SPLIT_ENV not in os.environ


@pytest.mark.parametrize(
    "line",
    ["pp1 spec", "pp2 no spec", "pp2 spec, vLLM's worker (V2 or VLLM_PPSPEC_AUTO=0)"],
)
def test_no_split_where_the_plugin_does_not_act(models, monkeypatch, line):
    """Lines the plugin does not serve keep vLLM's split and the variable unset:
    PP=1, no speculative decoding, and any line vLLM's own worker serves, V1 or
    V2 (where vLLM picks Model Runner V2 the plugin's worker is never built)."""
    if line == "pp1 spec":
        cfg = _tiny(models, "draft_copy", pp=1)
    elif line == "pp2 no spec":
        cfg = _config(models["target"], pipeline_parallel_size=2, worker_cls=PLUGIN)
    else:
        monkeypatch.setenv("VLLM_PPSPEC_AUTO", "0")
        cfg = _tiny(models, "draft_copy")
        assert "ppspec" not in str(cfg.parallel_config.worker_cls)
    assert layer_split.apply(cfg) is None
    assert SPLIT_ENV not in os.environ


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_each_worker_sets_the_split_before_vllms_init_device(models, monkeypatch, platform):
    """PPSpecCPUWorker and PPSpecGPUWorker: the variable is in place when vLLM's
    init_device (which builds the runner) starts, and vLLM's own reading of it
    (``get_pp_indices``, called as the model is built) gives each rank its
    layers of the 3,1 split."""
    from vllm.distributed.utils import get_pp_indices

    if platform == "cpu":
        from vllm.v1.worker.cpu_worker import CPUWorker as Base

        from vllm_ppspec.workers import cpu as module

        worker_cls = module.PPSpecCPUWorker
        monkeypatch.setattr(module, "require_installed", lambda: None)
    else:
        from vllm.v1.worker.gpu_worker import Worker as Base

        from vllm_ppspec.workers import gpu as module

        worker_cls = module.PPSpecGPUWorker
    seen = []

    def vllms_init_device(self):
        seen.append(os.environ.get(SPLIT_ENV))
        seen.append([get_pp_indices(4, rank, 2) for rank in (0, 1)])

    monkeypatch.setattr(Base, "init_device", vllms_init_device)
    monkeypatch.setattr(module, "install_group", lambda *a, **k: None)
    worker = object.__new__(worker_cls)
    worker.vllm_config = _tiny(models, "draft_copy", worker_cls=PLUGIN)
    worker.init_device()
    assert seen == ["3,1", [(0, 3), (3, 4)]]  # vLLM's even split: (0, 2), (2, 4)


# The real pair (fixtures/real_pair.py): Qwen2.5-Coder-1.5B and its 0.5B drafter.
QWEN_1_5B = _llama(1536, 28, 8960, 12, 2, 151936)
QWEN_0_5B = _llama(896, 24, 4864, 14, 2, 151936)


def test_the_split_follows_the_draft_model_to_the_first_stage(monkeypatch):
    """On the last stage the 0.5B's three passes outweigh the whole target's
    layers: the plugin gives the first stage all it may (24,4, the weight limit).
    On the first stage (VLLM_PPSPEC_DRAFTER_STAGE=first, or unset: auto puts
    this pair there) the layers go the other way, as far as the same limit
    lets them."""
    config = _stand_in(QWEN_1_5B, "draft_model", QWEN_0_5B)
    config.scheduler_config = SimpleNamespace(async_scheduling=False)
    monkeypatch.setenv("VLLM_PPSPEC_DRAFTER_STAGE", "last")
    assert layer_split.split_for(config) == ([24, 4], [14, 14])
    monkeypatch.delenv("VLLM_PPSPEC_DRAFTER_STAGE")
    default = layer_split.split_for(config)
    monkeypatch.setenv("VLLM_PPSPEC_DRAFTER_STAGE", "first")
    split, even = layer_split.split_for(config)
    assert (split, even) == default
    assert even == [14, 14] and split[0] < split[1] and sum(split) == 28
    free, _ = layer_split.split_for(config, weight_limit=False)
    assert free[0] <= split[0]  # the work alone moves at least as many
    # Async scheduling keeps the drafter last, and the split with it.
    config.scheduler_config.async_scheduling = True
    assert layer_split.split_for(config) == ([24, 4], [14, 14])


def test_auto_puts_the_draft_model_first_where_the_stages_balance_better(monkeypatch):
    """``VLLM_PPSPEC_DRAFTER_STAGE=auto`` (choice/drafter_stage.py): the real
    pair's 0.5B drafter outweighs the 1.5B target's tail on the last stage, so
    its three passes go to the first stage (measured there 1.12-1.41x the
    last, docs/measurements.md); the bench's one-layer drafter leaves the two
    placements within the estimate's error and stays last; so does a model
    the estimate has no figures for."""
    from vllm_ppspec.choice import drafter_stage

    pair = _stand_in(QWEN_1_5B, "draft_model", QWEN_0_5B)
    on_first, why = drafter_stage.auto(pair)
    assert on_first and why.startswith("auto: on the first stage the busiest stage reads 0.8"), why
    first = drafter_stage.busiest(28, 2, estimate(pair, first=True))
    last = drafter_stage.busiest(28, 2, estimate(pair, first=False))
    assert first < 0.9 * last, (first, last)
    bench = _stand_in(PLANTED, "draft_model", PLANTED_DRAFTER)
    on_first, why = drafter_stage.auto(bench)
    assert not on_first and why.startswith("auto: on the first stage the busiest"), why
    hybrid = _stand_in(QWEN_1_5B, "draft_model", QWEN_0_5B)
    hybrid.model_config.is_hybrid = True
    assert drafter_stage.auto(hybrid) == (
        False,
        "auto: no estimate of the stages' work for this model",
    )


@pytest.mark.parametrize("device", ["cuda", "xpu", None])
def test_auto_keeps_the_draft_model_last_on_devices_the_first_stage_drafter_never_ran_on(device):
    """The default (``auto``) moves the drafter only on the CPU, the one backend
    whose attention runs the first-stage drafter's hand-built metadata in these
    tests; on CUDA (vLLM's V1 GPU runner) the real pair stays last, and says how
    to ask for the first stage."""
    from vllm_ppspec.choice import drafter_stage

    on_first, why = drafter_stage.auto(
        _stand_in(QWEN_1_5B, "draft_model", QWEN_0_5B, device=device)
    )
    assert not on_first
    assert why == (
        f"auto: the first-stage drafter is tested on cpu only, not on {device}; "
        "VLLM_PPSPEC_DRAFTER_STAGE=first asks for it"
    )


def test_auto_is_decided_once_by_the_plan_and_the_split_follows_it(monkeypatch):
    """The plan settles ``auto`` into a placement (Plan.drafter_first), with the
    reason where it stays last; the weights rule's split then counts the
    drafter where the plan put it."""
    from vllm_ppspec.choice.plan import Plan, keep, plan_of, with_switches
    from vllm_ppspec.choice.policy import Mode

    monkeypatch.setenv("VLLM_PPSPEC_DRAFTER_STAGE", "auto")
    sync = Plan(worker=True, line=True, mode=Mode.SYNC, pp=2)
    for target, draft, on_first in (
        (QWEN_1_5B, QWEN_0_5B, True),
        (PLANTED, PLANTED_DRAFTER, False),
    ):
        config = _stand_in(target, "draft_model", draft)
        config.scheduler_config = SimpleNamespace(async_scheduling=False)
        config.additional_config = {}
        keep(config, with_switches(sync, config))
        plan = plan_of(config)
        assert plan.drafter_first is on_first, plan
        assert plan.drafter_why.startswith("auto: on the first stage the busiest"), plan
        assert (estimate(config).first_work > 0) is on_first
