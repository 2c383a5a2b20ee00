"""The bench's output check: every configuration's tokens against a reference.

With ``--configs`` naming neither ``pp1 no spec`` nor ``no spec`` (say
``filled,async``), the configurations are checked against the first one run.
"""

from __future__ import annotations

from vllm_ppspec_tools.bench import check_tokens


def _row(outputs: list[list[int]]) -> dict[str, object]:
    return {"outputs": outputs}


def test_against_pp1_no_spec_when_it_ran() -> None:
    table = {
        "pp1 no spec": {"1": _row([[1, 2]])},
        "no spec": {"1": _row([[1, 2]])},
        "filled": {"1": _row([[1, 3]])},
    }
    assert check_tokens(table) == ["filled@1"]


def test_against_the_first_configuration_without_a_no_spec_reference() -> None:
    table = {
        "filled": {"4": _row([[1, 2]]), "16": _row([[5]])},
        "async": {"4": _row([[1, 2]]), "16": _row([[6]])},
    }
    assert check_tokens(table) == ["async@16"]
    table["async"]["16"] = _row([[5]])
    assert check_tokens(table) == []
