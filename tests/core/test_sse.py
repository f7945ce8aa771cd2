from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from agl_lite.core.sse import DoneDetector, SSEEvent, SSEParser, find_done

STREAM = (
    b": a comment\n"
    b'data: {"a": 1}\n\n'
    b"event: ping\ndata: x\n\n"
    b"data: line1\r\ndata: line2\r\n\r\n"
    b"data:nospace\r\rdata: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent(b'{"a": 1}'),
    SSEEvent(b"x", event="ping"),
    SSEEvent(b"line1\nline2"),
    SSEEvent(b"nospace"),
    SSEEvent(b"[DONE]"),
]


def feed_all(chunks: list[bytes]) -> list[SSEEvent]:
    parser = SSEParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_whole_stream_in_one_chunk() -> None:
    assert feed_all([STREAM]) == EXPECTED


def test_byte_by_byte() -> None:
    assert feed_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_any_chunking_yields_the_same_events(cuts: list[int]) -> None:
    points = sorted({0, len(STREAM), *cuts})
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    assert feed_all(chunks) == EXPECTED


def test_crlf_split_between_chunks_is_one_line_end() -> None:
    assert feed_all([b"data: a\r", b"\n\r", b"\n"]) == [SSEEvent(b"a")]


def test_line_over_one_megabyte_in_small_reads() -> None:
    payload = b"x" * (1_500_000)
    raw = b"data: " + payload + b"\n\n"
    chunks = [raw[i : i + 4096] for i in range(0, len(raw), 4096)]
    assert feed_all(chunks) == [SSEEvent(payload)]


def test_incomplete_event_is_not_emitted() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: partial\n") == []
    assert parser.feed(b"\n") == [SSEEvent(b"partial")]


def test_find_done_in_chunk() -> None:
    chunk = b'data: {"x":1}\n\ndata: [DONE]\n\n'
    assert chunk[find_done(b"\n", chunk) :] == b"data: [DONE]\n\n"


def test_find_done_at_stream_start() -> None:
    assert find_done(b"\n", b"data: [DONE]\n\n") == 0


def test_find_done_split_across_reads_returns_zero() -> None:
    assert find_done(b'"}]}\n\ndata: [DO', b"NE]\n\n") == 0


def test_done_inside_json_content_is_not_the_end() -> None:
    chunk = b'data: {"content":"data: [DONE]"}\n\n'
    assert find_done(b"\n", chunk) == -1


def test_find_done_when_the_split_falls_before_the_closing_bracket() -> None:
    assert find_done(b'"}]}\n\ndata: [DONE', b"]\n\n") == 0


OPENAI_STREAM = (
    b'data: {"choices":[{"delta":{"content":"[DONE]"}}]}\n\ndata: {"choices":[]}\n\ndata: [DONE]\n\n'
)


@given(st.lists(st.integers(min_value=1, max_value=len(OPENAI_STREAM) - 1), max_size=12))
def test_relay_cut_holds_back_the_done_line_under_any_chunking(cuts: list[int]) -> None:
    """What the relay sends before the commit never holds a complete [DONE] line; the cut happens exactly once."""
    points = sorted({0, len(OPENAI_STREAM), *cuts})
    detector = DoneDetector()
    sent_before_commit = b""
    commits = 0
    for a, b in itertools.pairwise(points):
        chunk = OPENAI_STREAM[a:b]
        cut = detector.feed(chunk)
        if cut >= 0:
            commits += 1
            sent_before_commit += chunk[:cut]
        elif not commits:
            sent_before_commit += chunk
    assert commits == 1
    assert b"data: [DONE]\n" not in sent_before_commit
    assert sent_before_commit.startswith(OPENAI_STREAM[: OPENAI_STREAM.index(b"data: [DONE]") - 12])


def test_detector_ignores_a_done_inside_content_and_finds_the_real_one() -> None:
    detector = DoneDetector()
    assert detector.feed(b'data: {"content":"[DONE]"}\n\n') == -1
    assert detector.feed(b"data: [DONE]\n\n") == 0
    assert detector.feed(b"data: [DONE]\n\n") == -1  # only once
