"""Acceptance against what each tiny drafter was built for (the e2e tests)."""

from __future__ import annotations

from tests.engine_jobs import GREEDY_REQUESTS

K = 3


def check_acceptance(method: str, spec: dict | None, requests=GREEDY_REQUESTS, k: int = K) -> None:
    """Acceptance against what each fixture was built for.

    ``reference_acceptance`` replays each drafter's planted rule (ngram: vLLM's own
    lookup) on the model-free greedy output. Slack: vLLM (stock too, PP=1) may
    count one extra all-rejected round when a one-token prompt joins the batch,
    and the MTP head is planted mostly right (measured 89 of 92 accepted).
    """
    assert spec is not None and spec["drafts"] > 0, spec
    if method == "draft_random":
        assert spec["accepted"] < spec["drafts"] // 4, spec  # mostly rejected
        return
    accepted, drafted = planted_counts(method, requests, k)
    slack = 3 if method == "mtp" else 0
    assert accepted - slack <= spec["accepted"] <= accepted, (spec, accepted, drafted)
    assert drafted <= spec["drafts"] <= drafted + k, (spec, accepted, drafted)


def planted_counts(method: str, requests, k: int = K) -> tuple[int, int]:
    """(accepted, drafted) the drafter of ``method`` was planted for on
    ``requests`` (greedy, each alone: ``reference_acceptance``)."""
    from vllm_ppspec_tools.fixtures.tiny_models import reference_acceptance

    drafter = {"draft_copy": "copy", "ngram": "ngram", "eagle3_aux": "aux"}.get(method, "succ")
    accepted, drafted = (
        sum(x)
        for x in zip(
            *(
                reference_acceptance(r["prompt_token_ids"], r["max_tokens"], k, drafter)
                for r in requests
            ),
            strict=True,
        )
    )
    return accepted, drafted


def check_hybrid_acceptance(spec: dict | None, requests, k: int = K) -> None:
    """Acceptance of a hybrid ``*_copy`` MTP head against its planted rule
    (``tiny_hybrid_rules.reference_acceptance``): accepted and drafted within 5%
    of the rule's (bf16 near-ties may move a few)."""
    from vllm_ppspec_tools.fixtures.tiny_hybrid_rules import reference_acceptance

    assert spec is not None and spec["drafts"] > 0, spec
    accepted, drafted = (
        sum(x)
        for x in zip(
            *(reference_acceptance(r["prompt_token_ids"], r["max_tokens"], k) for r in requests),
            strict=True,
        )
    )
    print(f"ACCEPTANCE hybrid MTP k={k}: {spec} planted ({accepted}, {drafted})")
    assert abs(spec["accepted"] - accepted) <= 0.05 * accepted, (spec, accepted)
    assert abs(spec["drafts"] - drafted) <= 0.05 * drafted, (spec, drafted)
