"""The open-files limit, raised at start-up to what the configured caps need.

Every client connection and every upstream connection is a file descriptor. At the common soft limit of 1,024, about
a thousand idle sockets (unauthenticated ones included, held until `header_timeout_s`) made every `accept` fail:
the gateway looked down for everyone. The soft limit can be raised up to the hard one without privileges.
"""

from __future__ import annotations

import resource

import structlog

__all__ = ["SPARE", "raise_nofile"]

log = structlog.get_logger("agl_lite.limits")

SPARE = 4096
"""Descriptors wanted beyond the upstream pool: client connections, the store's files, the runner's pipes."""


def raise_nofile(upstream_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to what `upstream_connections` plus as many clients need (and `SPARE`), or as
    far as the hard limit allows, with a warning then; returns the soft limit in force."""
    want = 2 * upstream_connections + SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < want:
        log.warning(
            "the open-files limit is below what the configured caps need: clients may be refused under load",
            limit=target,
            needed=want,
            fix="raise the hard limit (ulimit -Hn, LimitNOFILE= in systemd) or lower upstream.max_connections",
        )
    return target
