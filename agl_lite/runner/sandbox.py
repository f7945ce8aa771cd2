"""The local runner's sandbox: runs one command in new user, mount and PID namespaces (docs/runners.md, "What a
local agent can reach"). Started as `python -I -S sandbox.py SPEC ARGV...` with the command's env; stdlib only, since
it must not import agl-lite or anything on the agent's PYTHONPATH.

Inside: the store's files, key files and config are masked, the whole file tree is read-only but for the
attempt's own directory and the `writable` paths, `/proc` shows only the attempt's processes, and the command runs
without capabilities. When the command ends, everything it started ends with it (the namespace's init exits).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

SETUP_FAILED = 125
"""Exit code when the sandbox could not be set up (what failed is on stderr, after `agl-lite sandbox:`)."""
CANNOT_EXEC = 127
"""Exit code when the command could not be started (as a shell reports it)."""

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (syscalls added after 5.1 share one table)
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 1
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class SetupError(Exception):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _set_readonly(path: str, readonly: bool, recursive: bool) -> None:
    attr = _MountAttr(_MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else _MOUNT_ATTR_RDONLY, 0, 0)
    flags = _AT_RECURSIVE if recursive else 0
    res = _libc.syscall(
        _SYS_MOUNT_SETATTR,
        ctypes.c_int(_AT_FDCWD),
        os.fsencode(path),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(res, f"mount_setattr {path} (Linux 5.12 or later is needed)")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _enter_namespaces() -> None:
    """New user (the same uid and gid inside), mount, PID and IPC namespaces; this process's next child is PID 1.
    (IPC: System V shared memory, semaphores and message queues of the attempt's own, gone with it, and none of
    another attempt's to meet in.)"""
    uid, gid = os.geteuid(), os.getegid()
    _check(
        _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC),
        "unshare (user namespaces disabled?)",
    )
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _build_view(spec: dict[str, Any]) -> None:
    """The attempt's file tree: private mounts, masks, read-only everywhere but its own directories."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    own = spec["own"]
    # Kept open across the masking of their parents, to be put back where they were.
    handles = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in own}
    for path in spec["mask_dirs"]:
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
    for path in spec["mask_files"]:
        _mount("/dev/null", path, None, _MS_BIND)
    for path, fd in handles.items():
        os.makedirs(path, exist_ok=True)  # under a masked parent the directory is gone: make its mount point
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)
    _set_readonly("/", True, recursive=True)
    for path in own:
        _set_readonly(path, False, recursive=False)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=64m")


def _drop_privileges() -> None:
    """No capabilities, now and after any exec (not even inside the user namespace), and none to gain from setuid
    files. The process's own sets are emptied too: a fork server's step runs its script in this very process,
    with no exec to recompute them from the (empty) bounding set, and with the namespace's full set it could
    unmount the masks and write the read-only tree."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "drop capabilities")
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    none = (_CapData * 2)()  # (zeroed: effective, permitted and inheritable, both 32-bit halves)
    _check(_libc.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), none), "capset")


def close_inherited(keep: int = -1, *, exec_follows: bool = True) -> None:
    """Take every file descriptor from 3 up but `keep` out of reach: a command gets stdin, stdout and stderr
    only (whatever its parent held open: init's report pipe, a descriptor a forking parent's loop left without
    close-on-exec, the gateway's own stderr, which a fork server's step would otherwise inherit). Where no exec
    follows (a fork server's step runs its script in this process), objects of the interpreter may still hold
    those numbers (a preloaded module's log file): each is pointed at /dev/null rather than closed, so that a
    number the agent opens next is never one that a stale object writes to or closes."""
    try:
        open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        open_fds = list(range(3, 1024))
    null = -1 if exec_follows else os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for fd in open_fds:
        if fd > 2 and fd not in (keep, null):
            with contextlib.suppress(OSError):  # (the listing's own descriptor is closed already)
                if null < 0:
                    os.close(fd)
                else:
                    os.dup2(null, fd, inheritable=False)
    if null >= 0:
        os.close(null)


def _exec(argv: list[str], report: int, run: Run | None) -> NoReturn:
    try:
        os.setsid()  # signals reach it through init, which forwards them to every process of the attempt
        _drop_privileges()
        if run is not None:
            close_inherited(exec_follows=False)
            run(argv)
        close_inherited(keep=report)  # (close-on-exec: gone if the exec succeeds, said on if it fails)
        os.execvpe(argv[0], argv, os.environ)
    except SetupError as exc:
        os.write(report, json.dumps({"setup": str(exc)}).encode())
    except OSError as exc:
        os.write(report, json.dumps({"exec": f"{exc.strerror or exc}"}).encode())
    os._exit(CANNOT_EXEC)


Run = Callable[[list[str]], NoReturn]
"""What the command's process does instead of exec (the fork server: run a Python script in this interpreter)."""


def _init(spec: dict[str, Any], argv: list[str], report: int, run: Run | None = None) -> NoReturn:
    """PID 1 of the attempt: start the command, forward signals to every process, reap, and when the command
    ends kill whatever it left behind; its status goes to `report`."""
    try:
        _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        _build_view(spec)
    except Exception as exc:  # whatever it is, the runner hears of it and the command does not start
        os.write(report, json.dumps({"setup": str(exc)}).encode())
        os._exit(SETUP_FAILED)
    child_report = os.dup(report)
    os.set_inheritable(child_report, False)
    child = os.fork()
    if child == 0:
        _exec(argv, child_report, run)
    os.close(child_report)
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: _kill_all(signum))
    status = 0
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            break
    _kill_all(signal.SIGKILL)
    while True:  # until every process of the attempt is gone and reaped
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    if os.WIFSIGNALED(status):
        os.write(report, json.dumps({"signal": os.WTERMSIG(status)}).encode())
    else:
        os.write(report, json.dumps({"exit": os.WEXITSTATUS(status)}).encode())
    os._exit(0)


def _kill_all(sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, sig)  # from PID 1: every other process of the namespace


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"agl-lite sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def main() -> NoReturn:
    confine(json.loads(sys.argv[1]), sys.argv[2:])


def confine(spec: dict[str, Any], argv: list[str], run: Run | None = None) -> NoReturn:
    """Run `argv` in the sandbox `spec` describes and exit as it exited (this process stays outside, as the
    runner's handle on the attempt)."""
    read_end, write_end = os.pipe()
    try:
        # A runner that dies (even by SIGKILL) takes its attempts with it: nothing outlives the runner.
        _check(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        if os.getppid() != spec["runner_pid"]:
            _fail("the runner is gone")
        _enter_namespaces()
    except (SetupError, OSError) as exc:
        _fail(str(exc))
    # The runner signals the whole process group: init gets the signal itself and forwards it.
    for sig in _FORWARDED:
        signal.signal(sig, signal.SIG_IGN)
    init = os.fork()
    if init == 0:
        os.close(read_end)
        for sig in _FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        _init(spec, argv, write_end, run)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    while True:
        try:
            os.waitpid(init, 0)
            break
        except InterruptedError:
            continue
    raw = b"".join(chunks)
    # The command's own report (it could not be started) comes before init's.
    result: dict[str, Any] = (
        json.JSONDecoder().raw_decode(raw.decode())[0] if raw else {"setup": "the sandbox's init was killed"}
    )
    if "setup" in result:
        _fail(result["setup"])
    if "exec" in result:
        sys.stderr.write(f"agl-lite sandbox: cannot start {argv[0]!r}: {result['exec']}\n")
        sys.stderr.flush()
        os._exit(CANNOT_EXEC)
    if "signal" in result:  # end as the command ended, so the runner reports the signal
        sig = result["signal"]
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(int(result.get("exit", SETUP_FAILED)))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        _fail("usage: sandbox.py SPEC ARGV...")
    try:
        main()
    except Exception as exc:  # never a traceback in an attempt's output
        _fail(f"{type(exc).__name__}: {exc}")
