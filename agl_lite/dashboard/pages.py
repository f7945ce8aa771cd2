"""The dashboard's pages: what each one reads from the store (paged reads only, so that a page costs the same
whatever the store holds) and its template, rendered with every value escaped (agent output is hostile input).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import jinja2
import orjson

from agl_lite.dashboard.plots import Chart, line_chart
from agl_lite.integrations.trajectory import MergeStats, Row, merge_trajectories
from agl_lite.store.records import Attempt, Event, LLMCall, Rollout, RolloutStatus
from agl_lite.store.rules import RolloutFilter, Store
from agl_lite.store.triplets import rollout_triplets

__all__ = [
    "PAGE_SIZE",
    "TRAINING_RESOURCE",
    "TokenCell",
    "Trajectory",
    "UpstreamRow",
    "gateway_page",
    "prompt_preview",
    "render",
    "rollout_page",
    "rollouts_page",
    "training_page",
]

PAGE_SIZE = 50
"""Rollouts per page of the list."""
MAX_CALLS = 200
"""Calls shown on a rollout's page (the calls API pages through the rest)."""
MAX_EVENTS = 500
MAX_TRAJECTORY_CALLS = MAX_CALLS
"""A rollout with more calls is shown without its merged trajectory: the page's cost must stay bounded whatever
an agent does (its token budget, when it has one, bounds it as well)."""
MAX_TOKENS_SHOWN = 50_000
"""Tokens of a trajectory shown, all rows together; the rest is counted, not drawn."""
PAGE_BYTES = 4 * 1024 * 1024
"""Stored bytes of calls or events one page reads at most."""

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("agl_lite.dashboard", "templates"),
    autoescape=True,  # every value, in every template: an agent's completion may hold markup
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


_ENV.filters["when"] = _when


def render(template: str, **context: Any) -> bytes:
    return _ENV.get_template(template).render(**context).encode()


async def rollouts_page(store: Store, flt: RolloutFilter, shown: dict[str, str]) -> dict[str, Any]:
    """One keyset page of rollouts (enqueue order) and the head of the completion cursor, where the page's live
    updates start. `shown`: the filters as the form shows them again (and the next page's link carries)."""
    rows = await store.list_rollouts(flt)
    _, cursor = await store.completed(0, 0)
    return {
        "rollouts": rows,
        "next": rows[-1].enqueue_seq if len(rows) == flt.limit else None,
        "cursor": cursor,
        "filters": shown,
        "statuses": [s.value for s in RolloutStatus],
    }


@dataclass(frozen=True, slots=True)
class TokenCell:
    """One token of a trajectory row as the page shows it: trained (the response mask is 1) or context."""

    id: int
    trained: bool
    shade: str
    """`lp0` (the model was sure) to `lp4` (it was not), by the token's sampled logprob; "" when unknown."""
    title: str


@dataclass(frozen=True, slots=True)
class Trajectory:
    rows: list[list[TokenCell]]
    stats: MergeStats
    versions: list[str | None]


def _bounded(rows: list[list[TokenCell]]) -> list[list[TokenCell]]:
    out, left = [], MAX_TOKENS_SHOWN
    for row in rows:
        out.append(row[:left])
        left = max(0, left - len(row))
    return out


def prompt_preview(call: LLMCall) -> tuple[str, str]:
    """The role and text of a call's last prompt message, whatever shape the agent sent: a request that failed
    validation is stored as it came (a string, a list, a message that is no object), and must not break the page."""
    request = call.request
    messages = request.get("messages") if isinstance(request, dict) else None
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        role, content = messages[-1].get("role"), messages[-1].get("content")
        text = content if isinstance(content, str) else orjson.dumps(content, default=str).decode()
        return (role if isinstance(role, str) else "", text[:4000])
    if request is None:
        return ("", "")
    return ("", orjson.dumps(request, default=str).decode()[:4000])


_SHADES = ((-0.1, "lp0"), (-0.5, "lp1"), (-1.0, "lp2"), (-2.0, "lp3"))


def _shade(logprob: float | None) -> str:
    if logprob is None:
        return ""
    return next((name for bound, name in _SHADES if logprob >= bound), "lp4")


def token_cells(row: Row) -> list[TokenCell]:
    """The row's prompt (context) then its response tokens, each trained or not by the response mask, the trained
    ones shaded by their logprob."""
    cells = [TokenCell(t, False, "", f"prompt token {t}") for t in row.prompt_ids]
    lps = row.logprobs
    for i, (t, mask) in enumerate(zip(row.response_ids, row.response_mask, strict=True)):
        lp = lps[i] if lps is not None and mask else None
        title = (
            f"token {t}, trained" + (f", logprob {lp:.3f}" if lp is not None else "")
            if mask
            else f"token {t}"
        )
        cells.append(TokenCell(t, bool(mask), _shade(lp), title))
    return cells


async def rollout_page(store: Store, rollout_id: str) -> dict[str, Any]:
    """A rollout, its attempts, its first calls and events, and its calls merged into the rows a trainer sees."""
    rollout: Rollout = await store.get_rollout(rollout_id)
    attempts: list[Attempt] = await store.attempts(rollout_id)
    calls: list[LLMCall] = await store.calls(rollout_id, limit=MAX_CALLS, max_bytes=PAGE_BYTES)
    events: list[Event] = await store.events(rollout_id, limit=MAX_EVENTS, max_bytes=PAGE_BYTES)
    trajectory = None
    if len(calls) < MAX_TRAJECTORY_CALLS:
        rows, stats = merge_trajectories((await rollout_triplets(store, rollout_id)).triplets)
        trajectory = Trajectory(
            _bounded([token_cells(r) for r in rows]), stats, [r.model_version for r in rows]
        )
    return {
        "tokens": await store.tokens_used(rollout_id),
        "rollout": rollout,
        "attempts": attempts,
        "calls": calls,
        "events": events,
        "trajectory": trajectory,
        "max_trajectory_calls": MAX_TRAJECTORY_CALLS,
        "previews": [prompt_preview(c) for c in calls],
    }


TRAINING_RESOURCE = "training"
"""The resource a trainer puts its metrics to, one version per iteration (`{"iteration": k, "mean_reward": ...}`)."""
MAX_ITERATIONS = 1000
_TITLES = {
    "mean_reward": "Mean reward",
    "held_out_accuracy": "Held-out accuracy",
    "accuracy": "Accuracy",
    "group_reward_spread": "Group reward spread (mean of each group's max - min)",
    "mismatch": "Logprob mismatch, trainer vs server (mean abs)",
    "staleness": "Staleness (versions behind)",
    "rollouts_per_s": "Rollouts per second",
}


async def training_page(store: Store, resource: str) -> dict[str, Any]:
    """A chart per number the trainer recorded, over the resource's versions (its iterations): the known names
    first, then any other, each point labelled with its iteration's model version when it has one."""
    versions = await store.resource_versions(resource, 0, MAX_ITERATIONS)
    metrics = [v.value for v in versions if isinstance(v.value, dict)]
    keys: list[str] = []
    for m in metrics:
        keys += [k for k, v in m.items() if _number(v) and k != "iteration" and k not in keys]
    keys.sort(key=lambda k: (k not in _TITLES, list(_TITLES).index(k) if k in _TITLES else 0, k))
    labels = [
        str(m.get("version") or m.get("model_version") or m.get("iteration", i))
        for i, m in enumerate(metrics)
    ]
    charts: list[Chart] = [
        line_chart(
            _TITLES.get(key, key),
            [
                (label, float(m[key]) if _number(m.get(key)) else math.nan)
                for label, m in zip(labels, metrics, strict=True)
            ],
        )
        for key in keys
    ]
    return {"resource": resource, "charts": charts, "keys": keys}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(slots=True)
class UpstreamRow:
    model: str
    upstream: str
    in_flight: float = 0.0
    cooling: bool = False
    requests: dict[str, float] = field(default_factory=dict)
    """Attempts by outcome (`2xx`, `4xx`, `5xx`, `error`, `cancelled`)."""
    errors: float = 0.0


def gateway_page(registry: Any | None) -> dict[str, Any]:
    """The gateway's state as its own metrics say it (`metrics`, `control` and `route` export them): pause and
    drain, calls in flight and held, each upstream's load, health and outcomes, and time to first byte per model.
    None without the `metrics` addon."""
    if registry is None:
        return {"metrics": False}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in registry.collect():
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))

    def one(name: str) -> float | None:
        values = samples.get(name)
        return values[0][1] if values else None

    upstreams: dict[tuple[str, str], UpstreamRow] = {}

    def row(labels: dict[str, str]) -> UpstreamRow:
        key = (labels.get("model", ""), labels.get("upstream", ""))
        return upstreams.setdefault(key, UpstreamRow(*key))

    for labels, value in samples.get("agl_upstream_in_flight", []):
        row(labels).in_flight = value
    for labels, value in samples.get("agl_upstream_cooling", []):
        row(labels).cooling = value > 0
    for labels, value in samples.get("agl_upstream_requests_total", []):
        counts = row(labels).requests
        counts[labels.get("status", "")] = counts.get(labels.get("status", ""), 0.0) + value
    for labels, value in samples.get("agl_upstream_errors_total", []):
        row(labels).errors += value
    first_byte: dict[str, list[float]] = {}
    for suffix in ("_sum", "_count"):
        for labels, value in samples.get("agl_llm_time_to_first_byte_seconds" + suffix, []):
            first_byte.setdefault(labels.get("model", ""), []).append(value)
    mean_first_byte = {m: (v[0] / v[1] if len(v) == 2 and v[1] else None) for m, v in first_byte.items()}
    tokens: dict[str, dict[str, float]] = {}
    for labels, value in samples.get("agl_llm_tokens_total", []):
        tokens.setdefault(labels.get("model", ""), {})[labels.get("kind", "")] = value
    return {
        "metrics": True,
        "paused": one("agl_gateway_paused"),
        "held": one("agl_gateway_held_requests"),
        "admitted": one("agl_gateway_in_flight_requests"),
        "in_flight": one("agl_llm_in_flight"),
        "upstreams": sorted(upstreams.values(), key=lambda r: (r.model, r.upstream)),
        "first_byte": mean_first_byte,
        "tokens": tokens,
    }
