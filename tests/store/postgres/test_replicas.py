"""Several gateway processes on one PostgreSQL database: what the store promises across replicas."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agl_lite.client import AglLiteClient
from agl_lite.errors import Forbidden
from agl_lite.store.postgres import PostgresStore
from agl_lite.store.records import AttemptStatus, RolloutConfig, RolloutStatus
from agl_lite.store.rules import EventSpec, RolloutSpec
from agl_lite.testing.gateway import write_config
from bench.harness.gateway_process import gateway_processes, start_gateway
from tests.conftest import ADMIN_KEY
from tests.store.test_rules import HeldRead, call

CHAIN = ("store", "auth", "store_api")

Replicas = tuple[PostgresStore, PostgresStore]


@pytest.fixture
async def replicas(postgres_db: str) -> AsyncIterator[Replicas]:
    """Two stores on one database: what two gateway replicas hold."""
    a, b = await PostgresStore.open(postgres_db), await PostgresStore.open(postgres_db)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@asynccontextmanager
async def not_listening(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch, kind: str
) -> AsyncIterator[None]:
    """`store` misses every notification made within (its listening connection was down); leaving waits until it
    missed one that starts with `kind`."""
    heard, missed = store._heard, threading.Event()

    def deaf(loop: Any, payload: str) -> None:
        if payload.startswith(kind):
            missed.set()

    monkeypatch.setattr(store, "_heard", deaf)
    yield
    assert await asyncio.to_thread(missed.wait, 10)
    monkeypatch.setattr(store, "_heard", heard)


ROLLOUTS = 10_000
LOOPS = 8


async def test_three_gateway_processes_with_eight_runner_loops_claim_every_rollout_once_and_lose_no_transition(
    tmp_path: Path, postgres_db: str
) -> None:
    """#21's acceptance: 3 gateway processes on one database, 8 runner loops claiming through them in turn (16 at a
    time) and finishing each rollout they got, until none is queued."""
    config = write_config(
        tmp_path, {}, chain=CHAIN, addons={"store": {"dsn": postgres_db}}, extra={"log": {"format": "json"}}
    )
    async with gateway_processes() as started:
        for _ in range(3):
            started.append(await start_gateway(Path(config.source), env={"AGL_KEY": ADMIN_KEY}))
        clients = [AglLiteClient(gw.url, ADMIN_KEY) for gw in started]
        try:
            for start in range(0, ROLLOUTS, 1000):
                specs = [RolloutSpec(input=i, id=f"r{i:05d}") for i in range(start, start + 1000)]
                await clients[start // 1000 % 3].enqueue(specs)
            claims: list[tuple[str, list[str]]] = []

            async def loop(k: int) -> None:
                client, runner = clients[k % 3], f"runner-{k}"
                while claimed := await client.claim(runner, 16):  # (nothing is enqueued meanwhile)
                    claims.append((runner, [r.id for r in claimed]))
                    for rollout in claimed:
                        await client.finish(rollout.id, RolloutStatus.SUCCEEDED)

            await asyncio.wait_for(asyncio.gather(*(loop(k) for k in range(LOOPS))), 600)
            claimed = Counter(rid for _, ids in claims for rid in ids)
            assert len(claimed) == ROLLOUTS
            assert max(claimed.values()) == 1  # no rollout handed to two runners
            assert len({runner for runner, _ in claims}) == LOOPS
            rows = [r async for r in clients[1].iter_rollouts(page_size=1000)]
        finally:
            for client in clients:
                await client.close()
    assert Counter(r.status for r in rows) == {RolloutStatus.SUCCEEDED: ROLLOUTS}  # no transition lost
    # The completion cursor: one position per rollout, none skipped.
    assert sorted(r.completion_seq for r in rows) == list(range(1, ROLLOUTS + 1))
    owners = {rid: runner for runner, ids in claims for rid in ids}
    assert all(r.runner_id == owners[r.id] for r in rows)


async def test_a_rollout_ended_through_one_replica_closes_its_agent_key_on_the_other(
    replicas: Replicas,
) -> None:
    """Each replica keeps the rollouts' states it has seen (the agent gate asks on every call): one that ends
    through another replica must not stay open here."""
    a, b = replicas
    ended: list[str] = []
    b.on_rollout_ended(ended.append)  # (the gateway cuts the rollout's calls in flight on it)
    await a.enqueue([RolloutSpec(input=1, id="r")])
    await a.claim("runner", 1)
    await b.agent_gate("r", "a1")  # running: open, and now known to b
    _, head = await b.completed(0, 0)
    await a.cancel("r", "stop")
    rows, _ = await asyncio.wait_for(b.completed(head, 10, wait=30), 10)  # woken by a's notification
    assert [r.id for r in rows] == ["r"]
    with pytest.raises(Forbidden, match="cancelled"):
        await b.agent_gate("r", "a1")
    assert ended == ["r"]


async def test_a_model_registered_through_one_replica_reaches_the_others_routes(postgres_db: str) -> None:
    """A weight sync registers the new version through one replica; every replica's `route` addon must learn of
    it (its hook is the store's model listener)."""
    a, b = await PostgresStore.open(postgres_db), await PostgresStore.open(postgres_db)
    heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    b.on_model_change(lambda m: heard.put_nowait(("set", m.version)))
    b.on_model_removed(lambda m: heard.put_nowait(("removed", m.name)))
    a.on_model_change(lambda m: heard.put_nowait(("a heard its own", m.version)))
    try:
        with psycopg.connect(
            postgres_db, autocommit=True
        ) as conn:  # another version's, or garbage: not fatal
            for payload in ("model x", "pause x {", "ended", "what"):
                conn.execute("SELECT pg_notify('agl_store', %s)", (payload,))
        await a.put_model("policy", [f"http://127.0.0.1:9/{'v' * 2000}/{i}" for i in range(8)], "step-6")
        got = {
            await asyncio.wait_for(heard.get(), 10) for _ in range(2)
        }  # (over 8,000 bytes: no notification)
        assert got == {("a heard its own", "step-6"), ("set", "step-6")}
        await a.put_model("policy", ["http://127.0.0.1:9/v1"], "step-7")
        got = {await asyncio.wait_for(heard.get(), 10) for _ in range(2)}
        assert got == {("a heard its own", "step-7"), ("set", "step-7")}  # (a's before put_model returned)
        await a.remove_model("policy")
        assert await asyncio.wait_for(heard.get(), 10) == ("removed", "policy")
        assert heard.empty()  # a does not hear its own notifications a second time
    finally:
        await a.close()
        await b.close()


async def test_a_rollouts_token_and_byte_totals_count_every_replicas_writes(postgres_db: str) -> None:
    """The token budget and the storage quota are checked against totals that every replica adds to: a replica's
    own count would let N replicas spend N budgets."""
    a, b = await PostgresStore.open(postgres_db), await PostgresStore.open(postgres_db)
    try:
        await a.enqueue([RolloutSpec(input=1, id="r")])
        await a.claim("runner", 1)
        assert await b.tokens_used("r") == 0  # (read before the others' writes: nothing kept from it)
        for i, store in enumerate((a, b, a, b)):
            await store.add_call(call("r", i, [1, 2, 3], [[4, 5]]))
        await b.add_events("r", [EventSpec("note", "x" * 100)])
        assert await a.tokens_used("r") == await b.tokens_used("r") == 4 * 5
        assert await a.rollout_bytes("r") == await b.rollout_bytes("r") > 4 * 100
        with psycopg.connect(
            postgres_db
        ) as conn:  # the migration's sum agrees with the writes' running totals
            summed = conn.execute(
                "SELECT SUM(length(body) + COALESCE(length(prompt_tail), 0) + length(choice_meta)"
                " + length(choice_ids) + COALESCE(length(logprobs), 0) + COALESCE(length(event), 0)) FROM calls"
            ).fetchone()
            events = conn.execute("SELECT SUM(length(body)) FROM events").fetchone()
        assert summed is not None
        assert events is not None
        assert await a.rollout_bytes("r") == summed[0] + events[0]
    finally:
        await a.close()
        await b.close()


async def test_a_rollout_claimed_through_one_replica_opens_its_agent_key_on_the_other(
    replicas: Replicas,
) -> None:
    """A replica that saw a rollout queued (an admin's call on its agent path, refused then) must not keep that
    state: its start through another replica is not announced, so a queued state kept would refuse the rollout's
    agents there for good."""
    a, b = replicas
    await a.enqueue([RolloutSpec(input=1, id="r")])
    with pytest.raises(Forbidden, match="queuing"):
        await b.agent_gate("r", "a1")
    await a.claim("runner", 1)
    await b.agent_gate("r", "a1")  # running: open on b too
    assert await b.rollout_status("r") is RolloutStatus.RUNNING


async def test_an_attempt_ended_through_one_replica_is_refused_by_the_others_gate(replicas: Replicas) -> None:
    a, b = replicas
    await a.enqueue([RolloutSpec(input=1, id="r", config=RolloutConfig(max_attempts=3))])
    await a.claim("runner", 1)
    await b.agent_gate("r", "pod-1")  # the attempt started, and known to b
    await a.update_attempt("r", "pod-1", AttemptStatus.LOST)
    async with asyncio.timeout(10):
        while ("r", "pod-1") in b._seen_attempts:  # noqa: ASYNC110 (the notification: polled, bounded)
            await asyncio.sleep(0.01)
    with pytest.raises(Forbidden, match="'pod-1' is lost"):
        await b.agent_gate("r", "pod-1")


async def test_a_gate_whose_snapshot_predates_an_attempts_end_on_another_replica_does_not_reopen_it(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's gate, at its first sight of an attempt that exists, only reads: under SERIALIZABLE its transaction can
    commit after a's end of the attempt and still be ordered before it. b hears of the end first; the gate's note,
    which runs at its commit, must not put the attempt back as running."""
    a, b = replicas
    await a.enqueue([RolloutSpec(input=1, id="r", config=RolloutConfig(max_attempts=3))])
    await a.claim("runner", 1)
    await a.agent_gate("r", "pod-1")  # the attempt started through a
    pair = ("r", "pod-1")
    heard = asyncio.Event()

    class Watched(set[tuple[str, str]]):
        def discard(self, item: Any) -> None:
            super().discard(item)
            if item == pair:
                heard.set()

    monkeypatch.setattr(b, "_seen_attempts", Watched())
    op_ran, release = threading.Event(), threading.Event()
    start_op = b._start_attempt_op

    def held_op(rollout_id: str, attempt_id: str | None) -> Any:
        op = start_op(rollout_id, attempt_id)

        def run(repo: Any) -> Any:
            found = op(repo)  # b's transaction sees the attempt running
            op_ran.set()
            release.wait(10)  # b's writer is slower to commit than a's
            return found

        return run

    monkeypatch.setattr(b, "_start_attempt_op", held_op)
    gate = asyncio.ensure_future(b.agent_gate("r", "pod-1"))  # b's first sight of pod-1
    assert await asyncio.to_thread(op_ran.wait, 10)
    await a.update_attempt("r", "pod-1", AttemptStatus.LOST)  # the runner: pod evicted
    await asyncio.wait_for(heard.wait(), 10)  # b heard of it
    release.set()
    await gate  # (b's transaction only read: it commits, serialised before a's)
    with pytest.raises(Forbidden, match="'pod-1' is lost"):
        await b.agent_gate("r", "pod-1")


async def test_an_attempt_ended_while_a_replica_was_not_listening_is_refused_there_once_it_caught_up(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's listening connection broke (a server restart, a network blip): what was notified meanwhile is lost,
    and `_caught_up` (run when it listens again) must forget what those notifications would have changed."""
    a, b = replicas
    await a.enqueue([RolloutSpec(input=1, id="r", config=RolloutConfig(max_attempts=3))])
    await a.claim("runner", 1)
    await b.agent_gate("r", "pod-1")  # the attempt started, and known to b
    async with not_listening(b, monkeypatch, "attempt "):
        await a.update_attempt("r", "pod-1", AttemptStatus.LOST)  # its notification: lost to b
    await b._caught_up()  # what `_listen` runs on b's loop once it listens again
    with pytest.raises(Forbidden, match="'pod-1' is lost"):
        await b.agent_gate("r", "pod-1")


async def test_a_status_read_in_flight_across_a_catch_up_does_not_reopen_an_ended_rollout(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b asks for r's status (its snapshot: running); r is cancelled through a while b is not listening; b listens
    again and forgets its states (`_caught_up`); then b's read comes back."""
    a, b = replicas
    await a.enqueue([RolloutSpec(input=1, id="r")])
    await a.claim("runner", 1)
    held = HeldRead(b, monkeypatch)
    asking = asyncio.ensure_future(b.rollout_status("r"))  # (b had not seen r)
    await held.read.wait()
    async with not_listening(b, monkeypatch, "ended "):
        await a.cancel("r")
    await b._caught_up()
    held.release.set()
    await asking
    # what b's auth asks for r's grader key (auth.py: `rollout_status(...) is not RUNNING` refuses it)
    assert await b.rollout_status("r") is RolloutStatus.CANCELLED
