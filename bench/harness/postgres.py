"""A real PostgreSQL server for the tests and the benches, started in a temporary directory (`initdb`, `pg_ctl`)
and stopped after.

Debian's `postgresql` package (`make test` installs it as root when missing) puts its programs under
`/usr/lib/postgresql/<version>/bin`; a PATH that has `initdb` wins. PostgreSQL refuses to run as root: as root the
server runs as the package's `postgres` user. It listens on a free loopback port only (no Unix socket), trusts
local connections, and runs with `fsync=off`: the tests kill gateways, never this server, and it is thrown away.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PG_BIN", "postgres_server"]


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(dirs[-1]).parent if dirs else None


PG_BIN = _bin_dir()
"""Where `initdb` and `pg_ctl` are (None: PostgreSQL is not installed, and the tests that need it skip)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def postgres_server() -> Iterator[str]:
    """A fresh server for the duration: yields the DSN of its `postgres` database, as superuser `agl`."""
    assert PG_BIN is not None
    root = Path(tempfile.mkdtemp(prefix="agl-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        os.chmod(root, 0o755)
        data.mkdir(mode=0o700)
        shutil.chown(data, "postgres", "postgres")
    port = _free_port()
    log = root / "server.log"
    log.touch()
    if as_user:
        shutil.chown(log, "postgres", "postgres")

    def run(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, capture_output=True, timeout=120)

    try:
        run(str(PG_BIN / "initdb"), "-D", str(data), "-U", "agl", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
        run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
        try:
            yield f"postgresql://agl@127.0.0.1:{port}/postgres"
        finally:
            run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
