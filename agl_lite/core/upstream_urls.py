"""What an upstream base URL may be, checked once for routes.toml and for `POST /api/models` alike.

An endpoint is `http(s)://host[:port][/path]` in plain ASCII, and no more: userinfo (`user:pw@`) would travel into
every error message and record that names the upstream, so credentials go in the route's `api_key_env` instead; a
query or fragment would be glued to every API path; a port that is no port, or bytes that are no URL, failed later,
mid-call. `ENDPOINT_PATTERN` is the whole rule, so the OpenAPI document can state it as it is enforced.
"""

from __future__ import annotations

import re

from yarl import URL

__all__ = ["ENDPOINT_PATTERN", "endpoint_problem"]

_PORT = r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
_H = "[0-9A-Fa-f]{1,4}"
_IPV6 = "|".join(  # the forms of RFC 4291 § 2.2 without an embedded IPv4 address
    (
        f"(?:{_H}:){{7}}{_H}",
        f"(?:{_H}:){{1,7}}:",
        f"(?:{_H}:){{1,6}}:{_H}",
        *(f"(?:{_H}:){{1,{6 - k}}}(?::{_H}){{1,{k + 1}}}" for k in range(1, 6)),
        f"{_H}:(?::{_H}){{1,6}}",
        f":(?:(?::{_H}){{1,7}}|:)",
    )
)
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
ENDPOINT_PATTERN = (
    rf"^https?://(?:{_LABEL}(?:\.{_LABEL})*|\[(?:{_IPV6})\])"
    rf"(?::{_PORT})?(?:/[A-Za-z0-9._~!$&'()*+,;=:%/-]*)?$"
)
"""scheme, host (a name or a bracketed IPv6 address), an optional port 1-65535, an optional path."""
_ENDPOINT = re.compile(ENDPOINT_PATTERN)


def endpoint_problem(value: str) -> str | None:
    """Why `value` cannot be an upstream base URL; None when it can."""
    if "@" in value.partition("://")[2].partition("/")[0]:
        return "it holds credentials (user:password@): give the upstream's key with api_key_env instead"
    if not value.startswith(("http://", "https://")):
        return "it must start with http:// or https://"
    if not _ENDPOINT.fullmatch(value):  # (not `match`: its `$` also takes a final newline)
        return "it must be http(s)://host[:port][/path] in plain ASCII (no query, fragment or spaces; port 1-65535)"
    try:
        URL(value).port  # noqa: B018 (what the upstream client will do with it)
    except (ValueError, TypeError) as exc:
        return f"it is not a URL ({exc})"
    return None
