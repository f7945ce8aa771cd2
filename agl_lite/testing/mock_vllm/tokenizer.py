"""Deterministic fake tokenizer and SmolLM2-style ChatML template for the mock vLLM server.

It owns how text becomes token ids in the mock; it must not pretend to be a real BPE, only to be stable,
reversible for ordinary text, and segment-wise so a chat turn's prompt+completion is a prefix of the next prompt.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BOS_ID",
    "DEFAULT_SYSTEM_PROMPT",
    "EOS_ID",
    "EOS_TEXT",
    "FakeTokenizer",
    "hermes_tool_text",
    "message_text",
]

BOS_ID = 1
EOS_ID = 2
EOS_TEXT = "<|im_end|>"
_SPECIALS = {"<|endoftext|>": 0, "<|im_start|>": BOS_ID, EOS_TEXT: EOS_ID}
_VOCAB_LO, _VOCAB_HI = 3, 49151
_CACHE_LIMIT = 200_000
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Every character falls in exactly one branch, so joining the pieces gives the text back, and cutting a piece
# list anywhere and re-encoding the joined prefix gives the same pieces (letter runs are greedy).
_PIECE_RE = re.compile(r" ?[^\W\d_]+| ?\d| ?[^\s\w]|_|\s")
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in _SPECIALS) + ")")


def message_text(message: Mapping[str, Any]) -> str:
    """The text a chat message renders to: string content, text parts joined, then any tool calls as hermes."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    else:
        text = "" if content is None else str(content)
    calls = message.get("tool_calls") or []
    blocks = [
        hermes_tool_text(str(c["function"]["name"]), str(c["function"].get("arguments") or "{}"))
        for c in calls
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]
    return "\n".join([text, *blocks]) if text and blocks else text or "\n".join(blocks)


def hermes_tool_text(name: str, arguments: str) -> str:
    """A tool call as the hermes parser expects it; `arguments` is the JSON string, inserted verbatim."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'


class FakeTokenizer:
    """Word-ish pieces hashed to ids in [3, 49151]; `<|im_start|>` is 1 and `<|im_end|>` (EOS) is 2."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = dict(_SPECIALS)
        self._pieces: dict[int, str] = {v: k for k, v in _SPECIALS.items()}

    def piece_id(self, piece: str) -> int:
        pid = self._ids.get(piece)
        if pid is None:
            pid = zlib.crc32(piece.encode("utf-8")) % (_VOCAB_HI - _VOCAB_LO + 1) + _VOCAB_LO
            if len(self._ids) < _CACHE_LIMIT:  # a long-lived mock fed unique strings must not grow forever
                self._ids[piece] = pid
                self._pieces.setdefault(pid, piece)  # first piece wins a hash collision when decoding
        return pid

    def split(self, text: str) -> list[str]:
        """Pieces of `text`; special-token strings become single pieces."""
        out: list[str] = []
        for i, part in enumerate(_SPECIAL_RE.split(text)):
            if i % 2:
                out.append(part)
            elif part:
                out.extend(_PIECE_RE.findall(part))
        return out

    def encode(self, text: str) -> list[int]:
        return [self.piece_id(p) for p in self.split(text)]

    def token_str(self, token_id: int) -> str:
        return self._pieces.get(token_id, f"<id_{token_id}>")

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.token_str(i) for i in ids)

    def chat_prompt_ids(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """SmolLM2's ChatML, each message's text encoded on its own so echoed assistant turns re-tokenize alike."""
        ids: list[int] = []
        if not messages or messages[0].get("role") != "system":
            ids += self._turn("system", DEFAULT_SYSTEM_PROMPT)
        for m in messages:
            ids += self._turn(str(m.get("role", "user")), message_text(m))
        if add_generation_prompt:
            ids += [BOS_ID, *self.encode("assistant\n")]
        return ids

    def _turn(self, role: str, text: str) -> list[int]:
        return [BOS_ID, *self.encode(role + "\n"), *self.encode(text), EOS_ID, *self.encode("\n")]
