"""The fork server's process (docs/runners.md, "Fast start for Python agents"): a Python interpreter that imported
the agents' heavy modules once and forks one process per attempt step, so that a step costs a fork, not an
interpreter start and the imports. Started by `forkserver.py` as `PYTHON -P zygote.py SETTINGS` with the control
socket's fd in SETTINGS; stdlib only, like `sandbox.py`, whose confinement each step goes through unchanged.

What a step's secrets never touch: this process. It receives only file descriptors (the step's own socket and its
output socket); the step's child reads its argv, env and sandbox spec from its socket after the fork, so no agent
key, and no other rollout's data, ever sits in the memory every later step inherits.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

_PR_SET_PDEATHSIG = 1
_MAX_REQUEST = 16 * 1024 * 1024


def _load_sandbox() -> Any:
    spec = importlib.util.spec_from_file_location("agl_lite_sandbox", Path(__file__).with_name("sandbox.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sandbox = _load_sandbox()


def _send(ctl: socket.socket, message: dict[str, Any]) -> None:
    ctl.sendall(json.dumps(message).encode() + b"\n")


def _read_request(sock: socket.socket) -> dict[str, Any]:
    chunks, size = [], 0
    while chunk := sock.recv(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_REQUEST:
            raise ValueError("request too large")
    request: dict[str, Any] = json.loads(b"".join(chunks))
    return request


_COERCED: str | None = None
"""The LC_CTYPE this interpreter set at its start (PEP 538 locale coercion), which a fresh one would set too."""


def _step_env(env: dict[str, str]) -> dict[str, str]:
    """The env a fresh interpreter started with `env` would have: PEP 538's coercion of a C locale included."""
    if (
        _COERCED
        and "LC_ALL" not in env
        and "LC_CTYPE" not in env
        and env.get("LANG", "C") in ("C", "POSIX", "")
    ):
        return {**env, "LC_CTYPE": _COERCED}
    return env


def _run_script(request: dict[str, Any]) -> NoReturn:
    """In the step's command process: become `PYTHON SCRIPT ARGS...` started with the step's env and cwd."""
    argv: list[str] = request["argv"]
    os.environ.clear()
    os.environ.update(_step_env(request["env"]))
    os.chdir(request["cwd"])
    script = os.path.abspath(argv[1])
    sys.argv = [argv[1], *argv[2:]]
    sys.path.insert(0, os.path.dirname(script))
    code: Any = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code & 0xFF)


def _child(sock: socket.socket, out: int) -> NoReturn:
    """One step, forked: its own session, its output on `out`, then the sandbox (or none) around the script."""
    try:
        os.setsid()  # the runner signals the step's process group: this one
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # ends with the fork server
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(devnull)
        request = _read_request(sock)
        sock.close()
        # Nothing of this server's reaches a step: its stdio's copies (the gateway's own stderr among them), the
        # descriptors a preloaded module opened.
        sandbox.close_inherited(exec_follows=False)
    except Exception as exc:
        os.write(2, f"agl-lite sandbox: the fork server could not start the step: {exc!r}\n".encode())
        os._exit(sandbox.SETUP_FAILED)
    spec = request.get("sandbox")
    if spec is None:
        _run_script(request)
    spec["runner_pid"] = os.getppid()  # the confinement's parent check: this process's parent is the server
    os.environ.clear()
    os.environ.update(request["env"])
    sandbox.confine(spec, request["argv"], lambda _argv: _run_script(request))
    os._exit(sandbox.SETUP_FAILED)  # (confine does not return)


def _fds(ctl: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = ctl.recvmsg(4096, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def serve(ctl: socket.socket, settings: dict[str, Any]) -> NoReturn:
    failed = {}
    for name in settings.get("preload", []):
        try:
            # a warm-up script: exercises what every step uses (lazy imports, caches)
            if name.endswith(".py"):
                runpy.run_path(name, run_name="__agl_lite_warmup__")
            else:
                importlib.import_module(name)
        except BaseException as exc:  # the steps import it themselves, and fail there if they must
            failed[name] = repr(exc)
    # Every step inherits these objects: frozen, the collector never walks them, so a step does not write to (and
    # copy) every page it shares with this process.
    gc.collect()
    gc.freeze()
    _send(ctl, {"ready": True, "preload_failed": failed})
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    steps: dict[int, int] = {}
    selector = selectors.DefaultSelector()
    selector.register(ctl, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj is ctl:
                data, fds = _fds(ctl)
                if not data:  # the runner is gone or closed us: its steps go with it
                    for pid in steps:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(pid, signal.SIGKILL)
                    os._exit(0)
                step_id = json.loads(data)["id"]
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    ctl.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _child(socket.socket(fileno=fds[0]), fds[1])
                for fd in fds:
                    os.close(fd)
                steps[pid] = step_id
                _send(ctl, {"id": step_id, "pid": pid})
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    if pid in steps:
                        _send(ctl, {"id": steps.pop(pid), "status": status})


def main() -> NoReturn:
    global _COERCED
    settings = json.loads(sys.argv[1])
    if not settings.get("lc_ctype_given", True):
        _COERCED = os.environ.get("LC_CTYPE")
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # nothing outlives the runner
    if os.getppid() != settings["runner_pid"]:
        os._exit(1)
    serve(socket.socket(fileno=settings["fd"]), settings)


if __name__ == "__main__":
    main()
