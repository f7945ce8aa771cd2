"""The chunks of an upstream event stream as the translations read them: JSON objects in order, whatever the
reads' boundaries, nothing after `[DONE]`, stray events skipped."""

from __future__ import annotations

from agl_lite.translate.chunks import ChatChunks

STREAM = (
    b'data: {"a": 1}\n\n: comment\n\ndata: not json\n\ndata: [1, 2]\n\n'
    b'data: {"b": 2}\n\ndata: [DONE]\n\ndata: {"c": 3}\n\n'
)


def test_objects_in_order_until_done_whatever_the_reads() -> None:
    for size in (1, 2, 7, len(STREAM)):
        chunks = ChatChunks()
        got = [obj for i in range(0, len(STREAM), size) for obj in chunks.feed(STREAM[i : i + size])]
        assert got == [{"a": 1}, {"b": 2}]
        assert chunks.done


def test_not_done_until_done_arrives() -> None:
    chunks = ChatChunks()
    assert chunks.feed(b'data: {"a": 1}\n\ndata: [DO') == [{"a": 1}]
    assert not chunks.done
    assert chunks.feed(b"NE]\n\n") == []
    assert chunks.done
