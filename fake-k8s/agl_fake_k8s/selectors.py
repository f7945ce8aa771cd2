"""Label selectors (=, ==, !=, in, notin, exists, !exists, gt, lt) and field selectors (=, ==, !=), parsed once.

A selector that does not parse raises `SelectorError`, which the API answers as 400 BadRequest; matching works on
stored objects and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agl_fake_k8s.resources import Resource

__all__ = ["FieldSelector", "LabelSelector", "SelectorError", "field_value"]

_KEY = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})\Z")
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})\Z")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)\Z")
_COMPARE = re.compile(rf"^({_KEY})\s*([<>])\s*(-?\d+)\Z")
_VALUE_RE = re.compile(rf"^{_VALUE}\Z")


class SelectorError(ValueError):
    """A selector that does not parse; the message is the API's 400 message."""


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        match self.op:
            case "exists":
                return present
            case "!exists":
                return not present
            case "in" | "=":
                return present and value in self.values
            case "notin" | "!=":
                return not present or value not in self.values
            case _:
                if not present or not re.fullmatch(r"-?\d+", value):
                    return False
                (bound,) = self.values
                return int(value) > int(bound) if self.op == "gt" else int(value) < int(bound)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b` is two requirements."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _parse_requirement(part: str) -> _Requirement:
    if m := _EQUALITY.match(part):
        return _Requirement(m[1], "!=" if m[2] == "!=" else "=", frozenset({m[3]}))
    if m := _SET.match(part):
        values = [v.strip() for v in m[3].split(",")]
        if any(not _VALUE_RE.match(v) for v in values):
            raise SelectorError(f"unable to parse requirement: invalid label value in {part!r}")
        return _Requirement(m[1], m[2], frozenset(values))
    if m := _COMPARE.match(part):
        return _Requirement(m[1], "gt" if m[2] == ">" else "lt", frozenset({m[3]}))
    if m := _EXISTS.match(part):
        return _Requirement(m[2], "!exists" if m[1] else "exists", frozenset())
    raise SelectorError(f"unable to parse requirement: {part!r} is not a valid label selector requirement")


class LabelSelector:
    """A parsed `labelSelector` query value; the empty selector matches everything."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        parts = _split_top_level(text) if text.strip() else []
        if any(not p for p in parts):
            raise SelectorError(f"unable to parse requirement: empty requirement in {text!r}")
        self._requirements = tuple(_parse_requirement(p) for p in parts)

    @classmethod
    def from_match_labels(cls, labels: Mapping[str, str]) -> LabelSelector:
        return cls(",".join(f"{k}={v}" for k, v in labels.items()))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self._requirements)


def field_value(resource: Resource, obj: Mapping[str, Any], field: str) -> str:
    """The string a fieldSelector compares for `field` (missing fields compare as "")."""
    if field == "status.successful":  # a Job's field label is a count
        return str((obj.get("status") or {}).get("succeeded") or 0)
    value: Any = obj
    for part in field.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


class FieldSelector:
    """A parsed `fieldSelector` for one resource; only the fields that resource supports are accepted."""

    def __init__(self, resource: Resource, text: str = "") -> None:
        self.text = text
        self._resource = resource
        self._terms: list[tuple[str, bool, str]] = []
        for part in text.split(",") if text.strip() else []:
            m = re.fullmatch(r"\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*", part)
            if m is None:
                raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
            field, op, value = m[1], m[2], m[3]
            if field not in ("metadata.name", "metadata.namespace") and field not in resource.field_labels:
                raise SelectorError(f"field label not supported: {field}")
            self._terms.append((field, op != "!=", value))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(self._resource, obj, f) == v) == eq for f, eq, v in self._terms)
