"""Contamination screening: hidden items are found through normalisation, partial copies are measured,
short items are matched whole, and the file walk never follows what an agent planted."""

from __future__ import annotations

import json
import os
import random
import tracemalloc
from pathlib import Path

import pytest

from graders.integrity import text
from graders.integrity.files import TextFileStats, text_files
from graders.integrity.text import HiddenIndex, normalise_tokens, screen

ITEM = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
OTHER = (
    "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"
)
WORDS = [f"w{i}" for i in range(40)]  # a 40-token item of distinct tokens: exact n-gram counts


def test_normalise_tokens_ignores_case_punctuation_and_whitespace() -> None:
    assert normalise_tokens("Q: 3+4\nA: #### 7") == ["q", "3", "4", "a", "7"]
    assert normalise_tokens("\uff33\uff34\uff32\uff21\u1e9ee snake_case") == [
        "strasse",
        "snake",
        "case",
    ]  # NFKC, casefold


def test_item_in_a_script_with_other_case_spacing_and_punctuation_is_found() -> None:
    index = HiddenIndex.build([OTHER, ITEM], ngram=8, min_item_tokens=3)
    script = (
        "import json\n\nPROMPTS = [\n"
        '    "natalia SOLD clips to 48 of her friends in april -- and then she sold half as many\\n"\n'
        '    "clips in may!!  how many clips did natalia sell altogether in april and may",\n]\n'
    )
    report = screen(index, [("script:job-a", script)], max_overlap=0.5)
    assert report.contaminated == (1,)
    assert report.findings[0].share == 1.0
    assert report.findings[0].where == ("script:job-a",)
    assert report.where() == ["script:job-a"]
    assert "1 of 2 hidden items found" in report.summary()


def test_item_copied_into_a_jsonl_line_with_escapes_is_found() -> None:
    item = "Léa has 3 apples.\nShe buys 4 more.\nHow many apples does Léa have now?\n#### 7"
    index = HiddenIndex.build([item], ngram=8, min_item_tokens=3)
    line = json.dumps({"id": 3, "text": item})  # ensure_ascii: "\\n" and "\\u00e9" escapes
    assert "\\n" in line
    assert "\\u00e9" in line
    report = screen(index, [("outputs:job-a/train.jsonl", line)], max_overlap=0.5)
    assert report.findings[0].share == 1.0


def test_an_item_of_fields_is_found_whatever_a_copy_puts_between_or_around_them() -> None:
    answer = "She sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 clips altogether. #### 72"
    fields = HiddenIndex.build([(ITEM, answer)], ngram=8, min_item_tokens=3)
    joined = HiddenIndex.build([f"{ITEM}\n{answer}"], ngram=8, min_item_tokens=3)
    # A training record: a key between the fields, or the fields the other way round.
    for record in ({"question": ITEM, "answer": answer}, {"answer": answer, "question": ITEM}):
        line = json.dumps(record)
        assert screen(fields, [("outputs:j/data.jsonl", line)], max_overlap=0.5).findings[0].share == 1.0
        # Cut across the fields, the n-grams that span the key are lost.
        assert screen(joined, [("outputs:j/data.jsonl", line)], max_overlap=0.5).max_share < 1.0
    # A field shorter than the n-gram is matched whole; one too short to mean anything (an empty or
    # one-word field) is joined with the next, and adds no n-gram of its own.
    short_answer = "Ava packs 3 * 9 = 27 shells"
    index = HiddenIndex.build([(ITEM, short_answer)], ngram=8, min_item_tokens=3)
    assert index.lengths == (6, 8)
    line = json.dumps({"question": ITEM, "answer": short_answer})
    assert screen(index, [("outputs:j/data.jsonl", line)], max_overlap=0.5).findings[0].share == 1.0
    short = HiddenIndex.build([("", "Q", ITEM)], ngram=8, min_item_tokens=3)
    assert short.lengths == (8,)


def test_one_copied_sentence_is_a_share_and_the_tolerance_decides() -> None:
    index = HiddenIndex.build([" ".join(WORDS)], ngram=8, min_item_tokens=3)
    copied = "Intro text. " + " ".join(WORDS[:20]) + " and then something else."
    share = 13 / 33  # 20 copied tokens hold 13 of the item's 33 8-grams
    assert screen(index, [("a", copied)], max_overlap=0.3).findings[0].share == pytest.approx(share)
    lenient = screen(index, [("a", copied)], max_overlap=0.5)
    assert lenient.contaminated == ()
    assert lenient.max_share == pytest.approx(share)


def test_share_is_the_union_over_sources() -> None:
    index = HiddenIndex.build([" ".join(WORDS)], ngram=8, min_item_tokens=3)
    # 15 of the 33 8-grams each (starts 0-14 and 18-32): 30 together.
    halves = [("first", " ".join(WORDS[:22])), ("second", " ".join(WORDS[18:]))]
    for where, half in halves:
        assert screen(index, [(where, half)], max_overlap=0.5).contaminated == ()
    report = screen(index, halves, max_overlap=0.5)
    assert report.contaminated == (0,)
    assert report.findings[0].share == pytest.approx(30 / 33)
    assert set(report.findings[0].where) == {"first", "second"}


def test_short_items_are_matched_whole() -> None:
    index = HiddenIndex.build(["Q: 3+4\nA: 7", "Q: 5+5\nA: 10"], ngram=13, min_item_tokens=5)
    found = screen(index, [("data", "junk q 3 + 4 a 7 junk")], max_overlap=0.5)
    assert found.contaminated == (0,)
    for miss in ("q 3 4 a 8", "xq 3 4 a 7", "q 3 4 a", "q 5 5 b 10"):
        assert screen(index, [("data", miss)], max_overlap=0.0).contaminated == ()


def test_items_below_min_item_tokens_are_not_screened() -> None:
    index = HiddenIndex.build(["7", "yes no", ITEM], ngram=8, min_item_tokens=3)
    report = screen(index, [("a", "7 yes no 7 yes no")], max_overlap=0.0)
    assert (report.items_screened, report.items_unscreened) == (1, 2)
    assert report.contaminated == ()
    assert "2 too short to screen" in report.summary()


def test_clean_text_finds_nothing() -> None:
    index = HiddenIndex.build([ITEM, OTHER], ngram=8, min_item_tokens=3)
    script = "How many clips did you train on? In April we sold 48 and then half as many in May.\n" * 50
    report = screen(index, [("script:job-a", script)], max_overlap=0.0)
    assert report.contaminated == ()
    assert report.where() == []
    assert report.summary().startswith("no hidden item found in 1 sources")
    assert report.figures()["contaminated"] == 0


def test_sources_are_ranked_and_bounded() -> None:
    items = [" ".join(f"t{i}x{j}" for j in range(12)) for i in range(20)]
    index = HiddenIndex.build(items, ngram=8, min_item_tokens=3)
    sources = [(f"outputs:job/{n:02d}.txt", "\n".join(items[: n + 1])) for n in range(12)]
    report = screen(index, sources, max_overlap=0.5)
    assert report.contaminated == tuple(range(12))
    assert report.sources_contaminated == 12
    assert report.where() == [f"outputs:job/{n:02d}.txt" for n in range(11, 3, -1)]
    assert all(len(finding.where) <= text.MAX_WHERE_PER_ITEM for finding in report.findings)
    assert len(report.figures()) <= 16


def test_chunked_scan_matches_a_whole_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(0)
    items = [" ".join(rng.choices(WORDS, k=rng.randrange(4, 30))) for _ in range(30)]
    index = HiddenIndex.build(items, ngram=8, min_item_tokens=3)
    pieces: list[str] = []
    for _ in range(200):  # filler (with tokens no item holds), then an item or a slice of one
        pieces += rng.choices([*WORDS, "x", "y."], k=rng.randrange(12))
        item = rng.choice(items).split()
        start = rng.randrange(len(item))
        pieces += item[start : start + rng.randrange(3, 20)]
    corpus = " ".join(pieces)
    whole = index.scan(corpus)
    assert whole  # some windows match, or this test would prove nothing
    for chunk in (7, 50, 333):
        monkeypatch.setattr(text, "CHUNK_CHARS", chunk)
        assert index.scan(corpus) == whole


def test_huge_text_scans_in_bounded_memory() -> None:
    index = HiddenIndex.build([ITEM, OTHER], ngram=8, min_item_tokens=3)
    filler = (
        "supercalifragilisticexpialidocious, antidisestablishmentarianism 1234567890.\n"  # few tokens: fast
    )
    half = filler * (10_000_000 // len(filler))
    # The item straddles the first chunk boundary and sits again in the middle of the text.
    head = filler * ((text.CHUNK_CHARS - 40) // len(filler))
    huge = head + ITEM + "\n" + half + OTHER + half
    assert len(huge) > 20_000_000
    tracemalloc.start()
    try:
        report = screen(index, [("outputs:job/big.txt", huge)], max_overlap=0.5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.contaminated == (0, 1)
    assert report.tokens_scanned > 750_000
    # The text's tokens alone would take over 50 MB as strings; chunks keep the peak near one chunk's.
    assert peak < 20_000_000, peak


@pytest.fixture
def planted_tree(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(ITEM)
    root = tmp_path / "outputs"
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "train.jsonl").write_text('{"prompt": "2+2", "completion": "4"}\n')
    (root / "nested" / "deeper" / "notes.md").write_text("# Notes\nnothing here\n")
    (root / "nested" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "nested" / "blob.dat").write_bytes(b"text then \0 binary")
    (root / "model.safetensors").write_text(ITEM)  # text, but weights are never screened
    (root / "big.txt").write_text("x" * 2000)
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(root / "pipe")  # opening it for reading would block forever
    return root


def test_text_files_reads_text_and_skips_everything_else(planted_tree: Path) -> None:
    stats = TextFileStats()
    files = dict(
        text_files(
            [("outputs:job-a", planted_tree)], max_file_bytes=1000, max_total_bytes=10_000, stats=stats
        )
    )
    assert sorted(files) == ["outputs:job-a/nested/deeper/notes.md", "outputs:job-a/train.jsonl"]
    assert files["outputs:job-a/train.jsonl"].startswith('{"prompt"')
    assert (stats.files_read, stats.skipped_binary, stats.skipped_too_large) == (2, 3, 1)
    assert stats.skipped_not_regular == 3  # two links and the FIFO
    assert not stats.truncated
    assert stats.summary().startswith("2 files read")
    assert "7 skipped: 3 binary, 1 too large, 3 not a regular file" in stats.summary()


def test_text_files_stops_at_the_total(tmp_path: Path) -> None:
    for n in range(10):
        (tmp_path / f"{n}.txt").write_text("y" * 100)
    stats = TextFileStats()
    files = list(text_files([("o", tmp_path)], max_file_bytes=1000, max_total_bytes=450, stats=stats))
    assert [where for where, _ in files] == ["o/0.txt", "o/1.txt", "o/2.txt", "o/3.txt"]
    assert stats.truncated
    assert stats.bytes_read == 400
    assert stats.summary().endswith("stopped at the size limit")


def test_text_files_survives_nesting_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    depth = 1100
    directory = os.open(tmp_path, os.O_RDONLY)
    for _ in range(depth):  # level by level: pathlib, os.makedirs and rmtree would recurse themselves
        os.mkdir("d", dir_fd=directory)
        parent, directory = directory, os.open("d", os.O_RDONLY, dir_fd=directory)
        os.close(parent)
    leaf = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, dir_fd=directory)
    os.write(leaf, b"found")
    os.close(leaf)
    os.close(directory)
    try:
        files = list(text_files([("o", tmp_path)], max_file_bytes=100, max_total_bytes=100))
        assert files == [("o/" + "d/" * depth + "leaf.txt", "found")]
    finally:
        os.unlink(os.path.join(tmp_path, *["d"] * depth, "leaf.txt"))
        for level in range(depth, 0, -1):
            os.rmdir(os.path.join(tmp_path, *["d"] * level))


def test_a_missing_root_yields_nothing(tmp_path: Path) -> None:
    stats = TextFileStats()
    assert (
        list(text_files([("o", tmp_path / "absent")], max_file_bytes=10, max_total_bytes=10, stats=stats))
        == []
    )
    assert stats.skipped == 0
