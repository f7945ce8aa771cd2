"""The output tail keeps the last bytes of a stream of any length (the process itself: test_local.py)."""

from __future__ import annotations

from agl_lite.runner.process import OutputTail


def test_the_tail_keeps_the_last_bytes_and_counts_them_all() -> None:
    tail = OutputTail(10)
    for i in range(100):
        tail.feed(f"{i:03d},".encode())
    assert tail.text() == "7,098,099,"
    assert tail.total == 400


def test_a_short_stream_is_kept_whole_and_bad_utf8_replaced() -> None:
    tail = OutputTail(100)
    tail.feed(b"ok \xff\n")
    assert tail.text() == "ok \ufffd\n"


def test_a_zero_limit_keeps_nothing() -> None:
    tail = OutputTail(0)
    tail.feed(b"abc")
    assert (tail.text(), tail.total) == ("", 3)
