"""The tiny fixtures' module docstrings list exactly the fixtures they build."""

from __future__ import annotations

import re

import pytest

from vllm_ppspec_tools.fixtures import tiny_hybrid, tiny_models


@pytest.mark.parametrize("module", [tiny_models, tiny_hybrid], ids=lambda m: m.__name__)
def test_fixtures_section_lists_every_fixture(module):
    doc = module.__doc__
    section = doc.split("Fixtures\n--------\n", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^``(\w+)``", section, flags=re.MULTILINE)
    assert listed == list(module.FIXTURES)
