"""The bounded log copies: the head as it comes, the end kept, one marker for what was skipped."""

from __future__ import annotations

from posttrain_launcher.joblog import PREFIX, BoundedLog

OUT, ERR = 1, 2


def _log(budget: int) -> tuple[BoundedLog, list[tuple[int, bytes]]]:
    written: list[tuple[int, bytes]] = []
    return BoundedLog(budget, lambda dest, data: written.append((dest, data))), written


def _text(written: list[tuple[int, bytes]]) -> str:
    return b"".join(data for _, data in written).decode()


def test_a_log_within_its_budget_passes_through_unchanged_and_in_order() -> None:
    log, written = _log(1000)
    for i in range(50):
        log.feed(OUT if i % 2 else ERR, f"line {i}\n".encode())
    log.close(ERR)
    assert _text(written) == "".join(f"line {i}\n" for i in range(50))
    assert [dest for dest, _ in written] == [ERR if i % 2 == 0 else OUT for i in range(50)]
    assert not log.overflowed


def test_past_its_budget_the_head_and_the_last_whole_lines_are_kept_around_one_marker() -> None:
    log, written = _log(4096)
    lines = [f"step {i:06d} loss {1 / (i + 1):.6f}\n" for i in range(20_000)]
    for line in lines:
        log.feed(OUT, line.encode())
    log.close(ERR)
    text = _text(written)
    head, marker, tail = text.partition(PREFIX)
    assert head == "".join(lines)[:3072]  # the head: three quarters of the budget, as it came
    assert marker
    skipped_line, _, tail = tail.partition("\n")
    assert tail == "".join(lines)[-len(tail) :] and tail.startswith("step ")  # whole lines
    assert tail.endswith(lines[-1]) and 1024 - len(lines[0]) < len(tail) <= 1024
    skipped = int(skipped_line.split(" bytes skipped")[0].rsplit(" ", 1)[-1])
    assert skipped == len("".join(lines)) - 3072 - len(tail)
    assert [dest for dest, _ in written if PREFIX.encode() in _] == [ERR]
    assert log.overflowed


def test_the_tail_keeps_each_chunk_on_its_own_stream() -> None:
    log, written = _log(1024)
    log.feed(OUT, b"x" * 5000)  # fills the head, the rest goes to the tail window
    log.feed(OUT, b"\nlast stdout line\n")
    log.feed(ERR, b"Traceback: the error\n")
    log.close(ERR)
    assert written[-2:] == [(OUT, b"last stdout line\n"), (ERR, b"Traceback: the error\n")]


def test_a_single_chunk_larger_than_the_window_keeps_its_end() -> None:
    log, written = _log(1024)
    log.feed(OUT, b"a" * 768 + b"b" * 10_000 + b"\nthe end\n")
    log.close(ERR)
    assert _text(written).endswith("\nthe end\n")
    assert len(_text(written)) < 1024 + 200
