"""Schema-driven fuzz of every API route (issue #9, point 3): schemathesis generates cases from the gateway's own
OpenAPI document — valid ones and, as many, ones that break the schema — and runs all its checks on every answer.

Beyond its checks: no 5xx, no hang (a client timeout per call), and a refused request (4xx) or a read leaves the
store exactly as it was (a digest of every SQLite row, read from another connection, before and after). The
gateway runs in its own process with the default chain; its log must hold no traceback. About a third of the
cases name rollouts that exist (running ones, with their attempts and keys), so the handlers are reached, not
only the 404s. Set AGL_SEED to replay a run.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.core.parameters import ParameterLocation

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.store.openapi import JSON_VALUE_REF
from agl_lite.testing.gateway import write_config
from bench.harness.gateway_process import gateway_processes, log_problems, secrets_in, start_gateway
from tests.conftest import ADMIN_KEY
from tests.reliability.sqlite_view import store_digest

pytestmark = pytest.mark.slow

CASES = int(os.environ.get("AGL_FUZZ_CASES", "1000"))
"""Cases in all (each operation gets its share, half valid, half not): 1,000 in CI; `make soak` runs 6,000."""
TIMEOUT_S = 10.0
"""Longest any answer may take: no route may hang (long-polls are capped below)."""
KNOWN_IDS_SHARE = 0.35
READS = {"GET", "HEAD"}


@pytest.fixture
def seed() -> int:
    value = int(os.environ.get("AGL_SEED") or random.SystemRandom().randrange(2**32))
    print(f"AGL_SEED={value}")
    return value


@dataclass
class Fuzz:
    url: str
    db: Path
    rng: random.Random
    http: requests.Session = field(default_factory=requests.Session)
    running: list[tuple[str, str]] = field(default_factory=list)
    """(rollout id, attempt id) of rollouts created running, for cases that should reach the handlers."""
    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    bodies: list[str] = field(default_factory=list)
    cases: int = 0

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(
            method,
            self.url + path,
            json=body,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=TIMEOUT_S,
        )
        assert r.status_code < 300, f"{method} {path}: {r.status_code} {r.text[:300]}"
        return r.json()

    def seed_rollouts(self, n: int = 3) -> None:
        """Running rollouts with an attempt each (the fuzz cancels, finishes and exhausts them as it goes)."""
        got = self.admin("POST", "/api/rollouts", {"rollouts": [{"input": {"n": i}} for i in range(n)]})
        claimed = self.admin("POST", "/api/runner/claim", {"runner_id": "fuzz", "limit": n})["rollouts"]
        assert len(claimed) == len(got["rollouts"])
        for r in claimed:
            attempt = self.admin("POST", f"/api/rollouts/{r['id']}/attempts", {})["attempt"]
            self.running.append((r["id"], attempt["id"]))

    def prepare(self, case: schemathesis.Case[Any]) -> dict[str, str]:
        """Point some cases at rollouts that exist, cap long-polls, and send the key the route's scope wants —
        leaving alone whatever part of a case schemathesis broke on purpose (its check expects a refusal)."""
        meta = case.meta
        broken_path = meta is not None and meta.is_negative_at(ParameterLocation.PATH)
        broken_auth = meta is not None and meta.is_negative_at(ParameterLocation.HEADER)
        params = case.path_parameters or {}
        if (
            not broken_path
            and "rollout_id" in params
            and self.running
            and self.rng.random() < KNOWN_IDS_SHARE
        ):
            rid, aid = self.rng.choice(self.running[-6:])
            params["rollout_id"] = rid
            if "attempt_id" in params:
                params["attempt_id"] = aid
        if case.query and "wait" in case.query:
            # a long-poll (up to 60 s) is allowed, not a hang; the fuzz does not wait on it
            case.query["wait"] = 0
        if case.query and "wait_drained" in case.query:
            case.query["wait_drained"] = 0
        tags = case.operation.definition.raw.get("tags", [])
        if broken_auth:
            return {}
        rid = str(params.get("rollout_id", ""))
        if "admin" in tags:
            key = ADMIN_KEY
        elif "agent" in tags:
            key = derive_key(ADMIN_KEY, rid, KeyRole.AGENT)
        elif "grader" in tags:
            key = derive_key(ADMIN_KEY, rid, KeyRole.GRADER)
        else:
            return {}
        return {"Authorization": f"Bearer {key}"}

    def first_sight(self, case: schemathesis.Case[Any], headers: dict[str, str]) -> None:
        """An agent key's first request with a new attempt id (a pod UID) upserts that attempt, whatever the
        request then is (auth comes before the body): by design, so it is done here first, with a plain read, and
        the case itself must then change nothing when it is refused."""
        params = case.path_parameters or {}
        if "agent" in case.operation.definition.raw.get("tags", []) and headers and "attempt_id" in params:
            task = f"{self.url}/r/{params['rollout_id']}/a/{params['attempt_id']}/task"
            self.http.get(task, headers=headers, timeout=TIMEOUT_S).close()

    def run_case(self, case: schemathesis.Case[Any]) -> None:
        headers = self.prepare(case)
        self.first_sight(case, headers)
        before = store_digest(self.db)
        try:
            response = case.call(base_url=self.url, session=self.http, headers=headers, timeout=TIMEOUT_S)
        except requests.Timeout:
            self.problems.append(f"no answer within {TIMEOUT_S:g} s: {case.as_curl_command()}")
            return
        self.cases += 1
        self.statuses[response.status_code] += 1
        self.bodies.append(response.text[:2000])
        where = f"{case.method} {case.formatted_path} -> {response.status_code}"
        if response.status_code >= 500:
            self.problems.append(f"5xx: {where}: {response.text[:300]}")
        if (response.status_code >= 400 or case.method in READS) and store_digest(self.db) != before:
            self.problems.append(f"the store changed: {where}")
        try:
            case.validate_response(response, headers=headers)
        except FailureGroup as exc:
            self.problems.append(f"{where}: {exc.args[0][:1200] if exc.args else exc!r}")


_TYPED = frozenset({"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const", "not"})


def bound_free_form(node: Any) -> Any:
    """`node` (the document, or any part of it) with each free-form subschema (pydantic's `Any`: no type at all;
    `dict[str, Any]`'s `additionalProperties: true`) bound to `JsonValue`, the values the API takes there.

    The served document leaves free-form fields free (a generator of invalid cases cannot tell an `anyOf` of every
    JSON type from a constraint); a generator of valid cases uses this form, so that it does not send integers
    past 64 bits, which are refused."""
    if isinstance(node, list):
        return [bound_free_form(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            out[key] = {name: _as_value_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = {"$ref": JSON_VALUE_REF} if value is True else _as_value_schema(value)
        elif key in ("anyOf", "oneOf", "allOf") and isinstance(value, list):
            out[key] = [_as_value_schema(sub) for sub in value]
        else:
            out[key] = bound_free_form(value)
    return out


def _as_value_schema(sub: Any) -> Any:
    if isinstance(sub, dict) and not _TYPED & sub.keys():
        return {**sub, "$ref": JSON_VALUE_REF}
    return bound_free_form(sub)


def _api_operations(schema: Any) -> list[Any]:
    return [
        r.ok()
        for r in schema.get_all_operations()
        if "api" in r.ok().definition.raw.get("tags", []) and r.ok().path != "/api/openapi.json"
    ]


def fuzz_operations(fuzz: Fuzz, document: dict[str, Any], seed: int) -> None:
    # Valid cases from the document with its free-form fields bound to what the API takes there (JsonValue:
    # integers within 64 bits); invalid ones from the document as served.
    by_mode = {
        GenerationMode.POSITIVE: _api_operations(schemathesis.openapi.from_dict(bound_free_form(document))),
        GenerationMode.NEGATIVE: _api_operations(schemathesis.openapi.from_dict(document)),
    }
    operations = by_mode[GenerationMode.POSITIVE]
    per_mode = CASES // (2 * len(operations)) + 1
    for i in range(len(operations)):
        fuzz.seed_rollouts()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            op = by_mode[mode][i]
            run: Callable[[], None] = settings(
                max_examples=per_mode,
                deadline=None,
                database=None,
                derandomize=False,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(given(case=op.as_strategy(generation_mode=mode))(fuzz.run_case))
            run = _seeded(run, seed)
            try:
                run()
            except Unsatisfiable:  # nothing to break in an operation without parameters or body
                assert mode is GenerationMode.NEGATIVE, f"{op.method} {op.path}: no valid case"


def _seeded(test: Callable[[], None], seed: int) -> Callable[[], None]:
    from hypothesis import seed as hypothesis_seed

    return hypothesis_seed(seed)(test)


async def test_fuzzing_every_api_route_finds_no_5xx_no_hang_no_schema_break_and_no_change_on_refusal(
    tmp_path: Path, seed: int
) -> None:
    write_config(
        tmp_path,
        {"smollm2": ["http://127.0.0.1:9/v1"]},  # LLM routes are not fuzzed here: nothing listens upstream
        chain=DEFAULT_CHAIN,
        addons={"store": {"backend": "sqlite", "path": "fuzz.db"}},
        extra={"log": {"format": "json"}},
    )
    async with gateway_processes() as started:
        gw = await start_gateway(tmp_path / "agl-lite.toml", env={"AGL_KEY": ADMIN_KEY})
        started.append(gw)
        fuzz = Fuzz(gw.url, tmp_path / "fuzz.db", random.Random(seed))
        await asyncio.to_thread(fuzz_operations, fuzz, fuzz.admin("GET", "/api/openapi.json"), seed)
        logs = list(gw.stderr)
    print(f"{fuzz.cases} cases; statuses {sorted(fuzz.statuses.items())}")
    assert fuzz.cases >= 0.9 * CASES  # (an operation without parameters has no invalid case)
    assert fuzz.problems == [], f"AGL_SEED={seed}: {len(fuzz.problems)} problems, first: {fuzz.problems[:10]}"
    reached = sum(n for s, n in fuzz.statuses.items() if s < 300)
    assert reached > fuzz.cases // 10, "the handlers were reached, not only refusals"
    assert log_problems(logs) == []
    assert secrets_in("\n".join(logs + fuzz.bodies), [ADMIN_KEY]) == []
