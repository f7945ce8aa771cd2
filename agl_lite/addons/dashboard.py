"""Dashboard: a read-only web view of the store for the admin (rollouts, their calls, events and trajectories),
served by the gateway itself under `/dashboard/` (docs/dashboard.md).

Its pages are server-rendered HTML (`agl_lite.dashboard`), every value escaped, under a strict
Content-Security-Policy (no inline script or style, nothing from elsewhere). It opens with the admin key only: sent
as `Authorization: Bearer`, or once to the login form, which exchanges it for a session cookie (`HttpOnly`,
`SameSite=Strict`); an agent's or grader's key gets 403. Forms that change state (login, logout) carry a CSRF
token. Its pages have the `session` scope: `auth` holds a key that is sent to the admin rule and lets a request
without one through, and this addon checks the session cookie before anything is read.
"""

from __future__ import annotations

import importlib.resources
import secrets
from datetime import datetime
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

import orjson
from multidict import CIMultiDict

from agl_lite.core.api import Param
from agl_lite.core.config import GatewayConfig
from agl_lite.core.contract import KeyRole, identify
from agl_lite.core.flow import Flow, Response
from agl_lite.core.routes import ID_PATTERN, HttpRoute, RouteKind, Scope
from agl_lite.core.services import ADMIN_KEY, METRICS_REGISTRY, LoadContext
from agl_lite.dashboard import pages
from agl_lite.dashboard.session import COOKIE, Session, Sessions, tokens_match
from agl_lite.errors import BadRequest, HttpError, PayloadTooLarge
from agl_lite.store.records import RolloutStatus
from agl_lite.store.rules import STORE, RolloutFilter, Store

__all__ = ["CSP", "Dashboard"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""Only the dashboard's own script and stylesheet run or apply: markup an agent wrote cannot."""
_LOGIN_COOKIE = "agl_dashboard_login"
_LONG_POLL_S = 25.0
_MAX_FORM_BYTES = 4096
_CURSOR = Param("integer", 0, 0, 2**62)
"""A keyset cursor in a query, parsed as the API's own parameters are (plain ASCII digits, bounded)."""
_REWARD = Param("number")
_STATUSES = frozenset(s.value for s in RolloutStatus)
_STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _route(
    name: str, method: str, path: str, summary: str, media: str = "text/html", scope: Scope = Scope.SESSION
) -> HttpRoute:
    return HttpRoute(name, method, path, scope, RouteKind.PAGE, summary, media=media)


class Dashboard:
    """Reads the store (`store`); sets nothing other addons read."""

    short_name = "dashboard"
    """Its name in a chain, and what other addons' `after` call it."""

    routes = (
        _route("dashboard", "GET", "/dashboard", "The dashboard (its rollouts page)."),
        _route("dashboard.slash", "GET", "/dashboard/", "The dashboard (its rollouts page)."),
        _route(
            "dashboard.login_form",
            "GET",
            "/dashboard/login",
            "The dashboard's login form.",
            scope=Scope.PUBLIC,
        ),
        _route(
            "dashboard.login",
            "POST",
            "/dashboard/login",
            "Exchange the admin key for a session cookie.",
            scope=Scope.PUBLIC,
        ),
        _route("dashboard.logout", "POST", "/dashboard/logout", "End the dashboard session."),
        _route("dashboard.rollouts", "GET", "/dashboard/rollouts", "Rollouts, filtered, in pages."),
        _route(
            "dashboard.completed",
            "GET",
            "/dashboard/rollouts/completed",
            "Rollouts that ended after a cursor (the list's live updates; a long poll).",
            media="application/json",
        ),
        _route(
            "dashboard.rollout", "GET", "/dashboard/rollouts/{rollout_id}", "One rollout and its trajectory."
        ),
        _route(
            "dashboard.training",
            "GET",
            "/dashboard/training",
            "The trainer's metrics per iteration, as plots.",
        ),
        _route(
            "dashboard.gateway", "GET", "/dashboard/gateway", "The gateway's state: pause, calls, upstreams."
        ),
        *(
            _route(
                f"dashboard.static.{name}", "GET", f"/dashboard/static/{name}", "A file.", media, Scope.PUBLIC
            )
            for name, media in _STATIC.items()
        ),
    )

    def __init__(self) -> None:
        self.sessions = Sessions()
        self._static = {
            name: importlib.resources.files("agl_lite.dashboard").joinpath("static", name).read_bytes()
            for name in _STATIC
        }

    def load(self, ctx: LoadContext) -> None:
        self._ctx = ctx

    def configure(self, config: GatewayConfig, options: None) -> None:
        self.store: Store = self._ctx.services.require(STORE, by="dashboard")
        # The key `auth` checks (its `key_env`), not one of our own: two readings of two variables could disagree.
        self._admin_key = self._ctx.services.require(ADMIN_KEY, by="dashboard")
        self.secure = config.public_url.lower().startswith("https:")

    async def request(self, flow: Flow) -> None:
        name = flow.route.name
        if not name.startswith("dashboard"):
            return
        if name.startswith("dashboard.static."):
            file = name.removeprefix("dashboard.static.")
            flow.response = _reply(200, self._static[file], _STATIC[file], cache="max-age=300")
        elif name == "dashboard.login_form":
            flow.response = self._login_form(flow, None, 200)
        elif name == "dashboard.login":
            flow.response = self._login(flow)
        else:
            session = self._session(flow)
            if session is None:
                flow.response = (
                    _see_other("/dashboard/login") if flow.route.media == "text/html" else _unauthorized()
                )
            elif name == "dashboard.logout":
                flow.response = self._logout(flow, session)
            else:
                try:
                    flow.response = await self._page(flow, session)
                except HttpError as exc:  # with the pages' own headers (CSP, nosniff, no-store)
                    response = _reply(exc.status, orjson.dumps(exc.body()), "application/json")
                    response.headers.update(exc.headers)
                    flow.response = response

    # --- who may look ----------------------------------------------------------------------------------------

    def _session(self, flow: Flow) -> Session | None:
        """The flow's session: its cookie's, or a one-request session when `auth` admitted the admin key (on these
        routes it refuses any other key: `Scope.SESSION`)."""
        if flow.metadata.get("auth.role") is KeyRole.ADMIN:
            return Session(csrf="", expires=0.0)  # (no form of a page shown this way can post)
        return self.sessions.get(_cookies(flow).get(COOKIE))

    def _login_form(self, flow: Flow, error: str | None, status: int) -> Response:
        if error is None and self._session(flow) is not None:
            return _see_other("/dashboard/rollouts")
        nonce = secrets.token_urlsafe(24)  # bound to this browser by its own cookie (`_LOGIN_COOKIE`)
        body = pages.render("login.html", csrf="", login_csrf=nonce, error=error)
        response = _reply(status, body)
        response.headers.add("Set-Cookie", self._cookie(_LOGIN_COOKIE, nonce, max_age=600))
        return response

    def _login(self, flow: Flow) -> Response:
        nonce = _cookies(flow).get(_LOGIN_COOKIE)
        if len(flow.request.body) > _MAX_FORM_BYTES:  # (before any parsing: anyone may post here)
            raise PayloadTooLarge(f"a login form is at most {_MAX_FORM_BYTES} bytes")
        form = _form(flow) if nonce else {}
        if not nonce or not tokens_match(form.get("csrf"), nonce):
            return self._login_form(flow, "The form expired or came from elsewhere: log in again.", 400)
        admin, key = self._admin_key(), form.get("key") or ""
        principal = identify(admin, key) if admin and key else None
        if principal is None or principal.role is not KeyRole.ADMIN:
            return self._login_form(flow, "That is not the admin key.", 401)
        token, _ = self.sessions.create()
        response = _see_other("/dashboard/rollouts")
        response.headers.add("Set-Cookie", self._cookie(COOKIE, token, max_age=int(self.sessions.ttl_s)))
        response.headers.add("Set-Cookie", self._cookie(_LOGIN_COOKIE, "", max_age=0))
        return response

    def _logout(self, flow: Flow, session: Session) -> Response:
        if not session.csrf_ok(_form(flow).get("csrf")):
            raise BadRequest("the logout form came without its CSRF token", param="csrf")
        self.sessions.drop(_cookies(flow).get(COOKIE))
        response = _see_other("/dashboard/login")
        response.headers.add("Set-Cookie", self._cookie(COOKIE, "", max_age=0))
        return response

    def _cookie(self, name: str, value: str, *, max_age: int) -> str:
        secure = "; Secure" if self.secure else ""
        return f"{name}={value}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"

    # --- the pages -------------------------------------------------------------------------------------------

    async def _page(self, flow: Flow, session: Session) -> Response:
        name = flow.route.name
        query = _query(flow)
        if name in ("dashboard", "dashboard.slash"):
            return _see_other("/dashboard/rollouts")
        if name == "dashboard.completed":
            stopping = self._ctx.stopping
            rows, cursor = await self.store.completed_until(stopping, _int(query, "after"), 100, _LONG_POLL_S)
            done = [{"id": r.id, "status": r.status.value, "reward": r.reward} for r in rows]
            return _reply(200, orjson.dumps({"rollouts": done, "cursor": cursor}), "application/json")
        if name == "dashboard.gateway":
            context = pages.gateway_page(self._ctx.services.get(METRICS_REGISTRY))
            return _reply(200, pages.render("gateway.html", csrf=session.csrf, **context))
        if name == "dashboard.training":
            resource = query.get("resource") or pages.TRAINING_RESOURCE
            if not ID_PATTERN.fullmatch(resource):
                raise BadRequest("resource: use 1-128 of A-Z a-z 0-9 _ -", param="resource")
            context = await pages.training_page(self.store, resource)
            return _reply(200, pages.render("training.html", csrf=session.csrf, **context))
        if name == "dashboard.rollout":
            rollout_id = flow.request.path_params["rollout_id"]
            context = await pages.rollout_page(self.store, rollout_id)
            return _reply(200, pages.render("rollout.html", csrf=session.csrf, **context))
        flt, shown = _rollout_filter(query)
        context = await pages.rollouts_page(self.store, flt, shown)
        return _reply(200, pages.render("rollouts.html", csrf=session.csrf, **context))


def _reply(
    status: int, body: bytes, media: str = "text/html; charset=utf-8", cache: str = "no-store"
) -> Response:
    headers = CIMultiDict(
        {
            "Content-Type": media,
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": cache,
        }
    )
    return Response(status, headers, body=body)


def _see_other(location: str) -> Response:
    response = _reply(303, b"")
    response.headers["Location"] = location
    return response


def _unauthorized() -> Response:
    body = {"error": {"type": "unauthorized", "message": "log in to the dashboard first", "code": 401}}
    return _reply(401, orjson.dumps(body), "application/json")


def _cookies(flow: Flow) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    for header in flow.request.headers.getall("Cookie", []):
        try:
            jar.load(header)
        except Exception:  # a malformed Cookie header is no session, not an error
            continue
    return {k: m.value for k, m in jar.items()}


def _query(flow: Flow) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(flow.request.query_string).items()}


def _form(flow: Flow) -> dict[str, str]:
    try:
        text = flow.request.body.decode()
    except UnicodeDecodeError:
        return {}
    return {k: v[-1] for k, v in parse_qs(text, max_num_fields=8).items()}


def _rollout_filter(query: dict[str, str]) -> tuple[RolloutFilter, dict[str, str]]:
    """The list's filters from its query (a 400 naming the first bad one), and as the form shows them again."""
    status = query.get("status") or None
    if status is not None and status not in _STATUSES:
        raise BadRequest(f"unknown status {status!r}", param="status")
    group = query.get("group_id") or None
    if group is not None and not ID_PATTERN.fullmatch(group):
        raise BadRequest("group_id: use 1-128 of A-Z a-z 0-9 _ -", param="group_id")
    version = query.get("model_version") or None
    if version is not None and len(version) > 256:
        raise BadRequest("model_version: at most 256 characters", param="model_version")
    rewards = {
        name: _REWARD.parse(name, query[name]) if query.get(name) else None
        for name in ("reward_min", "reward_max")
    }
    times = {name: _time(query, name) for name in ("since", "until")}
    flt = RolloutFilter(
        RolloutStatus(status) if status else None,
        query.get("mode") or None,
        group,
        _int(query, "after"),
        pages.PAGE_SIZE,
        rewards["reward_min"],
        rewards["reward_max"],
        version,
        times["since"],
        times["until"],
    )
    names = ("status", "mode", "group_id", "reward_min", "reward_max", "model_version", "since", "until")
    return flt, {name: query.get(name) or "" for name in names}


def _time(query: dict[str, str], name: str) -> float | None:
    """A time as the form's `datetime-local` input sends it (the server's local time, as the pages show times), or
    with an offset; epoch seconds."""
    raw = query.get(name)
    if not raw:
        return None
    try:
        if len(raw) > 40:
            raise ValueError
        return datetime.fromisoformat(raw).timestamp()
    except (ValueError, OverflowError, OSError):
        raise BadRequest(f"{name}: a date and time such as 2026-12-04T18:30", param=name) from None


def _int(query: dict[str, str], name: str) -> int:
    return int(_CURSOR.parse(name, query[name])) if name in query else 0
