"""Why a call that continues a conversation did not extend the earlier call's ids, told from the captured text.

The conversation test uses the digests the store keeps of each call's messages and of each reply; the rest uses
the ids and, when given, the tokenizer's `decode` (special tokens kept): same text with other ids is the
tokenizer's drift, other text for the same conversation is the chat template's doing. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum

from agl_lite.store.triplets import Triplet

__all__ = ["Decode", "Mismatch", "classify", "continues"]

Decode = Callable[[Sequence[int]], str]
"""A tokenizer's decode that keeps special tokens (`lambda ids: tok.decode(ids, skip_special_tokens=False)`)."""


class Mismatch(StrEnum):
    TEMPLATE = "template"
    """The same conversation rendered to other text: the chat template (or its default system prompt) changed."""
    RETOKENIZATION = "retokenization"
    """The same text as other ids: the sampler's ids for a reply are not what the tokenizer makes of its text."""
    OTHER = "other"
    """The conversation itself changed: the agent sent back an edited reply."""


def continues(parent: Triplet, child: Triplet, shared: int) -> bool | None:
    """Whether `child` carries on from `parent`'s conversation: True when it sends `parent`'s messages and then
    its reply verbatim, False when an edited reply takes its place, None when it is another conversation (a
    branch). Calls without messages (text completions) continue when their longer prompt starts with `parent`'s."""
    p, c = parent.conversation, child.conversation
    chat = bool(p) and not p[0].startswith("prompt:") and bool(c) and not c[0].startswith("prompt:")
    if not chat:
        longer = len(child.prompt_ids) > len(parent.prompt_ids)
        return True if longer and shared >= len(parent.prompt_ids) else None
    if len(c) <= len(p) or c[: len(p)] != p:
        return None
    following = c[len(p)]
    if following == parent.reply:
        return True
    return False if following.startswith("assistant:") else None


def classify(
    parent: Triplet, child: Triplet, decode: Decode | None, *, faithful: bool, shared: int
) -> Mismatch:
    """The kind of a split: `child` continues `parent` (`faithful`: with its reply verbatim) but its prompt ids
    share only `shared` ids with `parent`'s prompt + response."""
    if not faithful:
        return Mismatch.OTHER
    if decode is not None:
        # A reply cut by max_tokens inside a character ends in bytes that decode to U+FFFD; the client saw (and sent
        # back) the text without them, so they are no sign of a changed template.
        before = decode(parent.prompt_ids.tolist() + parent.response_ids.tolist()).rstrip("\ufffd")
        after = decode(child.prompt_ids.tolist())
        return Mismatch.RETOKENIZATION if after.startswith(before) else Mismatch.TEMPLATE
    # Without a tokenizer: the same messages render the same ids up to the reply unless the rendering changed.
    return Mismatch.RETOKENIZATION if shared >= len(parent.prompt_ids) else Mismatch.TEMPLATE
