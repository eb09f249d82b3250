"""The wheels a submission's jobs installed are screened member by member: an item a package carries
is found and named by job, wheel and member; what is not text, too large, a zip bomb or not a wheel
is skipped and counted, and the total bounds it all."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

from graders.integrity.files import TextFileStats
from graders.integrity.text import HiddenIndex, screen
from graders.integrity.wheels import wheel_texts
from tests.package_index import build_wheel

ITEM = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
LIMITS = {"max_member_bytes": 1 << 20, "max_total_bytes": 1 << 24}


def _carrier(directory: Path) -> Path:
    """A wheel whose module holds a test item, as a package a job installs could."""
    source = f"DATA = {json.dumps([{'question': ITEM}])}\n"
    return build_wheel(directory, "ptcarrier", "1.0", source)


def test_an_item_inside_a_wheel_is_found_and_named_by_job_wheel_and_member(tmp_path: Path) -> None:
    staged = tmp_path / "train-1"
    staged.mkdir()
    _carrier(staged)
    build_wheel(staged, "ptclean", "1.0", "VALUE = 1\n")
    (staged / "requirements.lock").write_text("ptcarrier==1.0 --hash=sha256:00\n")
    stats = TextFileStats()
    sources = list(wheel_texts([("wheel:train-1", staged)], stats=stats, **LIMITS))
    labels = [label for label, _ in sources]
    assert "wheel:train-1/ptcarrier-1.0-py3-none-any.whl/ptcarrier.py" in labels
    assert "wheel:train-1/ptclean-1.0-py3-none-any.whl/ptclean.py" in labels
    assert not any("requirements.lock" in label for label in labels)  # wheels only
    index = HiddenIndex.build([ITEM], ngram=8, min_item_tokens=3)
    report = screen(index, sources, max_overlap=0.5)
    assert report.contaminated == (0,)
    assert report.where() == ["wheel:train-1/ptcarrier-1.0-py3-none-any.whl/ptcarrier.py"]
    assert stats.files_read == len(sources)


def test_binary_oversized_and_bomb_members_and_broken_wheels_are_skipped(tmp_path: Path) -> None:
    wheel = tmp_path / "odd-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("odd/blob.bin", b"\0\1\2" * 100)
        archive.writestr("odd/latin1.txt", "café".encode("latin-1"))
        archive.writestr("odd/big.txt", "x" * ((1 << 20) + 1))
        archive.writestr("odd/ok.txt", "fine")
    # A member whose headers understate its size: zipfile inflates no more than declared, and the
    # check of what it inflated fails.
    bomb = tmp_path / "bomb-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/zeros.txt", "a" * (8 << 20))
    _understate_sizes(bomb)
    (tmp_path / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    os.symlink(wheel, tmp_path / "link-1.0-py3-none-any.whl")
    stats = TextFileStats()
    sources = dict(wheel_texts([("wheel:j", tmp_path)], stats=stats, **LIMITS))
    assert sources == {"wheel:j/odd-1.0-py3-none-any.whl/odd/ok.txt": "fine"}
    assert stats.skipped_binary == 2  # the NUL bytes and the Latin-1
    assert stats.skipped_too_large == 1  # big.txt, by its header
    assert stats.skipped_unreadable == 2  # the broken wheel, the bomb
    assert stats.skipped_not_regular == 1  # the link, never followed
    assert stats.bytes_read < 1 << 20


def test_the_total_bounds_the_members_read(tmp_path: Path) -> None:
    wheel = tmp_path / "many-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for i in range(10):
            archive.writestr(f"many/{i}.txt", "y" * 1000)
    stats = TextFileStats()
    sources = list(
        wheel_texts([("wheel:j", tmp_path)], max_member_bytes=4096, max_total_bytes=3500, stats=stats)
    )
    assert len(sources) == 3 and stats.truncated


def _understate_sizes(path: Path) -> None:
    """Rewrite every member's declared uncompressed size as 1 byte (local and central headers)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
    for info in infos:
        local = info.header_offset
        data[local + 22 : local + 26] = (1).to_bytes(4, "little")
    central = data.find(b"PK\x01\x02")
    while central != -1:
        data[central + 24 : central + 28] = (1).to_bytes(4, "little")
        central = data.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(data))
