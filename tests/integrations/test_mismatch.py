"""The split diagnosis on its own: the conversation test and the two ways to classify."""

from __future__ import annotations

from agl_lite.integrations.mismatch import Mismatch, classify, continues
from tests.integrations.conftest import tri

PARENT = tri(1, [1, 2, 3], [4, 5], conversation=["system:s", "user:a"], reply="assistant:r")


def test_the_parents_messages_then_its_reply_verbatim_is_a_faithful_continuation() -> None:
    child = tri(2, [1], [9], conversation=["system:s", "user:a", "assistant:r", "user:b"])
    assert continues(PARENT, child, 1) is True


def test_an_edited_reply_is_an_unfaithful_continuation() -> None:
    child = tri(2, [1], [9], conversation=["system:s", "user:a", "assistant:x", "user:b"])
    assert continues(PARENT, child, 1) is False


def test_other_messages_are_another_conversation() -> None:
    assert continues(PARENT, tri(2, [1], [9], conversation=["system:s", "user:z"]), 1) is None
    assert continues(PARENT, tri(2, [1], [9], conversation=["system:s", "user:a"]), 3) is None


def test_without_messages_a_longer_prompt_sharing_the_parents_continues() -> None:
    parent, longer = tri(1, [1, 2], [3]), tri(2, [1, 2, 9, 9], [4])
    assert continues(parent, longer, 2) is True
    assert continues(parent, tri(2, [1, 7, 9], [4]), 1) is None


def test_with_a_decoder_same_text_is_retokenization_and_other_text_is_template() -> None:
    words = {1: "<s>", 2: "Hi", 3: "?", 4: "Fine", 5: "</s>", 45: "Fi", 46: "ne", 9: "<t>"}

    def decode(ids):  # type: ignore[no-untyped-def]
        return "".join(words[i] for i in ids)

    same_text = tri(2, [1, 2, 3, 45, 46, 5], [6])
    other_text = tri(2, [9, 2, 3, 4, 5], [6])
    assert classify(PARENT, same_text, decode, faithful=True, shared=3) is Mismatch.RETOKENIZATION
    assert classify(PARENT, other_text, decode, faithful=True, shared=0) is Mismatch.TEMPLATE
    assert classify(PARENT, same_text, decode, faithful=False, shared=3) is Mismatch.OTHER


def test_without_a_decoder_the_position_of_the_divergence_decides() -> None:
    child = tri(2, [1], [6])
    assert classify(PARENT, child, None, faithful=True, shared=3) is Mismatch.RETOKENIZATION
    assert classify(PARENT, child, None, faithful=True, shared=2) is Mismatch.TEMPLATE


def test_a_reply_cut_inside_a_character_is_not_a_template_change() -> None:
    # Issue #15: max_tokens cut the reply inside "é" (its first byte only); the client saw the text before it and
    # sent that back, and the split was labelled `template` though the template had not changed.
    pieces = {1: b"<s>", 2: b"Hi", 3: b"?", 4: b"caf", 5: "é".encode()[:1], 6: b"</s>", 7: b"<t>"}

    def decode(ids):  # type: ignore[no-untyped-def]
        return b"".join(pieces[i] for i in ids).decode("utf-8", "replace")

    parent = tri(1, [1, 2, 3], [4, 5], conversation=["system:s", "user:a"], reply="assistant:caf")
    child = tri(2, [1, 2, 3, 4, 6], [7])
    assert decode([1, 2, 3, 4, 5]).endswith("\ufffd")
    assert classify(parent, child, decode, faithful=True, shared=4) is Mismatch.RETOKENIZATION
    changed = tri(2, [7, 2, 3, 4, 6], [7])
    assert classify(parent, changed, decode, faithful=True, shared=0) is Mismatch.TEMPLATE
