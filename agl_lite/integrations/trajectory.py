"""Trajectory merge: a rollout's triplets become training rows (DESIGN.md §6).

Per attempt, each call (each choice) attaches to the earlier one whose prompt + response ids are the longest exact
prefix of its prompt: a prefix tree, so parallel side calls form their own branches. Each root-to-leaf chain is a
row; the tokens between two turns are observations (mask 0, logprob 0); a change of model version starts a new row.
A call that continues a conversation but whose ids do not extend it is a split, classified by `mismatch`.
Pure: no I/O, no VERL.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agl_lite.integrations.mismatch import Decode, Mismatch, classify, continues
from agl_lite.store.packed_ids import common_prefix_len
from agl_lite.store.triplets import Triplet

__all__ = ["MergeStats", "Row", "Span", "merge_trajectories", "single_rows"]


@dataclass(frozen=True, slots=True)
class Span:
    """Where one step's response lies in its row's response (`start:end`), and whether this row trains it."""

    start: int
    end: int
    triplet: Triplet
    trained: bool


@dataclass(slots=True, eq=False)
class Row:
    """One training sequence: the first step's prompt, then everything after it as the response."""

    prompt_ids: array[int]
    response_ids: array[int]
    response_mask: array[int]
    """1 where the row trains a generated token; 0 on observations and on steps another row trains."""
    logprobs: array[float] | None
    """The sampler's logprob where the mask is 1, 0.0 elsewhere; None when a trained step had none."""
    spans: list[Span]
    model_version: str | None

    @property
    def last(self) -> Triplet:
        return self.spans[-1].triplet


@dataclass(slots=True)
class MergeStats:
    rows: int = 0
    steps: int = 0
    merged_steps: int = 0
    """Steps attached to an earlier step (their prompt extended it exactly)."""
    merged_rows: int = 0
    """Rows of more than one step."""
    split_version: int = 0
    """Rows started because the model version changed."""
    split_mismatch: int = 0
    """Rows started because a continued conversation's ids did not extend the earlier call's."""
    branches: int = 0
    """Rows started by a call that did not continue any earlier conversation (side calls, fresh contexts)."""
    shared_steps: int = 0
    """Steps on several rows (a fork after them): trained on one row only, context on the others."""
    mismatches: dict[Mismatch, int] = field(default_factory=dict)

    def add(self, other: MergeStats) -> None:
        for name in ("rows", "steps", "merged_steps", "merged_rows", "split_version", "split_mismatch"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.branches += other.branches
        self.shared_steps += other.shared_steps
        for kind, n in other.mismatches.items():
            self.mismatches[kind] = self.mismatches.get(kind, 0) + n


@dataclass(slots=True, eq=False)
class _Node:
    triplet: Triplet
    seq: bytes
    """Prompt + response ids, packed: prefix tests are one `bytes.startswith`."""
    prompt_bytes: bytes
    parent: _Node | None = None
    children: list[_Node] = field(default_factory=list)
    owner: _Node | None = None
    """The leaf of the row that trains this step."""


def _key(t: Triplet) -> tuple[int, int]:
    return (t.order_key, t.choice)


def _build_forest(steps: Sequence[Triplet], stats: MergeStats, decode: Decode | None) -> list[_Node]:
    nodes: list[_Node] = []
    for t in steps:
        prompt = t.prompt_ids.tobytes()
        node = _Node(t, prompt + t.response_ids.tobytes(), prompt)
        parent: _Node | None = None
        for earlier in nodes:  # ties go to the latest, as that is the branch the agent was on
            if (
                earlier.triplet.order_key < t.order_key
                and len(earlier.seq) <= len(prompt)
                and prompt.startswith(earlier.seq)
                and (parent is None or len(earlier.seq) >= len(parent.seq))
            ):
                parent = earlier
        if parent is not None and parent.triplet.model_version != t.model_version:
            stats.split_version += 1
            nodes.append(node)
            continue
        if parent is not None:
            node.parent = parent
            parent.children.append(node)
            stats.merged_steps += 1
        # Did it mean to continue a later call than the one it extends? (Only calls after its parent are looked
        # at, so a plain chain costs nothing here.)
        later = [
            n
            for n in nodes
            if n is not parent
            and n.triplet.order_key < t.order_key
            and (parent is None or n.triplet.order_key > parent.triplet.order_key)
        ]
        floor = 0 if parent is None else len(parent.seq) // 4
        if not _diagnose(later, t, floor, stats, decode) and parent is None and nodes:
            stats.branches += 1
        nodes.append(node)
    return nodes


def _diagnose(
    candidates: Sequence[_Node], t: Triplet, floor: int, stats: MergeStats, decode: Decode | None
) -> bool:
    """Record a split when `t` continues the conversation of a call whose ids it does not extend, sharing more
    than `floor` ids with it (more than with the call it did extend); False when there is none."""
    best, shared = None, -1
    for node in candidates:
        n = common_prefix_len(node.triplet.prompt_ids + node.triplet.response_ids, t.prompt_ids)
        if n >= shared:
            best, shared = node, n
    if best is None or shared <= floor:
        return False
    verdict = continues(best.triplet, t, shared)
    if verdict is None:
        return False
    kind = classify(best.triplet, t, decode, faithful=verdict, shared=shared)
    stats.split_mismatch += 1
    stats.mismatches[kind] = stats.mismatches.get(kind, 0) + 1
    return True


def _assign_owners(nodes: Sequence[_Node]) -> tuple[list[_Node], int]:
    """Leaves in order, and how many steps lie on several rows. Each step is trained on the row of the latest
    leaf below it: the branch that went on (a side call forking off is trained only for its own steps)."""
    leaves = sorted((n for n in nodes if not n.children), key=lambda n: _key(n.triplet))
    on_rows: dict[int, int] = {}
    for leaf in leaves:
        node: _Node | None = leaf
        while node is not None:
            node.owner = leaf  # a later leaf overwrites: the latest leaf below wins
            on_rows[id(node)] = on_rows.get(id(node), 0) + 1
            node = node.parent
    return leaves, sum(1 for n in on_rows.values() if n > 1)


def _row(leaf: _Node) -> Row:
    chain: list[_Node] = []
    node: _Node | None = leaf
    while node is not None:
        chain.append(node)
        node = node.parent
    chain.reverse()
    root = chain[0].triplet
    response: array[int] = array("I")
    mask: array[int] = array("b")
    logprobs: array[float] | None = array("f")
    spans: list[Span] = []
    for i, node in enumerate(chain):
        t = node.triplet
        if i:
            before = chain[i - 1].triplet
            observation = t.prompt_ids[len(before.prompt_ids) + len(before.response_ids) :]
            response.extend(observation)
            mask.extend(bytes(len(observation)))
            if logprobs is not None:
                logprobs.extend(array("f", bytes(4 * len(observation))))
        trained = node.owner is leaf
        start = len(response)
        response.extend(t.response_ids)
        n = len(t.response_ids)
        mask.extend(array("b", [1 if trained else 0]) * n)
        if logprobs is not None:
            if not trained:
                logprobs.extend(array("f", bytes(4 * n)))
            elif t.logprobs is not None:
                logprobs.extend(t.logprobs)
            else:
                logprobs = None
        spans.append(Span(start, len(response), t, trained))
    return Row(array("I", root.prompt_ids), response, mask, logprobs, spans, root.model_version)


def merge_trajectories(
    triplets: Iterable[Triplet], *, decode: Decode | None = None
) -> tuple[list[Row], MergeStats]:
    """Rows of a rollout's triplets: per attempt, ordered by their last step. `decode` (a tokenizer's, keeping
    special tokens) makes the mismatch diagnosis exact by text; without it the diagnosis is by token position."""
    stats = MergeStats()
    by_attempt: dict[str | None, list[Triplet]] = {}
    for t in triplets:
        by_attempt.setdefault(t.attempt_id, []).append(t)
    rows: list[Row] = []
    for steps in by_attempt.values():
        steps.sort(key=_key)
        leaves, shared = _assign_owners(_build_forest(steps, stats, decode))
        stats.shared_steps += shared
        rows += [_row(leaf) for leaf in leaves]
    stats.steps = sum(len(s) for s in by_attempt.values())
    stats.rows = len(rows)
    stats.merged_rows = sum(1 for r in rows if len(r.spans) > 1)
    return rows, stats


def single_rows(triplets: Iterable[Triplet]) -> tuple[list[Row], MergeStats]:
    """One row per triplet (`merge="none"`): its prompt, its response, every response token trained."""
    rows = []
    for t in triplets:
        n = len(t.response_ids)
        rows.append(
            Row(
                array("I", t.prompt_ids),
                array("I", t.response_ids),
                array("b", [1]) * n,
                None if t.logprobs is None else array("f", t.logprobs),
                [Span(0, n, t, True)],
                t.model_version,
            )
        )
    return rows, MergeStats(rows=len(rows), steps=len(rows))
