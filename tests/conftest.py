"""Shared fixtures: the admin key in the environment, and a gateway on a free port in front of any upstream."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from agl_lite.core.server import Gateway
from agl_lite.service import running_gateway
from agl_lite.testing.gateway import write_config
from bench.harness.postgres import PG_BIN, postgres_server

ADMIN_KEY = "test-admin-key-0123456789"

GatewayFactory = Callable[..., AbstractAsyncContextManager[Gateway]]


@pytest.fixture(autouse=True)
def _fresh_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CLI configures structlog for the process: a level filter (`check-config` logs warnings only) and loggers
    cached on first use. Run in-process by a test (CliRunner), both outlived it, and a later test's
    `structlog.testing.capture_logs` saw nothing: tests passed or failed by their order. Here nothing is cached,
    and each test ends with structlog's defaults back."""
    configure = structlog.configure

    def uncached(**kwargs: Any) -> None:
        configure(**{**kwargs, "cache_logger_on_first_use": False})

    monkeypatch.setattr(structlog, "configure", uncached)
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def admin_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AGL_KEY", ADMIN_KEY)
    return ADMIN_KEY


@pytest.fixture
def gateway_factory(tmp_path: Path) -> GatewayFactory:
    """`async with gateway_factory({"model": [base_url, ...]}, **write_config_kwargs) as gw:`"""
    counter = iter(range(1000))

    @asynccontextmanager
    async def factory(upstreams: dict[str, list[str]], **kwargs: Any) -> AsyncIterator[Gateway]:
        extra_addons = kwargs.pop("extra_addons", ())
        config = write_config(tmp_path / f"gw{next(counter)}", upstreams, **kwargs)
        async with running_gateway(config, extra_addons) as gw:
            yield gw

    return factory


def gateway_url(gw: Gateway) -> str:
    return f"http://127.0.0.1:{gw.port}"


_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """The DSN of the session's PostgreSQL server (its `postgres` database)."""
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's postgresql)")
    with postgres_server() as dsn:
        yield dsn


@pytest.fixture
def postgres_db(postgres_dsn: str) -> str:
    """A new, empty database on the session's server: its DSN."""
    import psycopg

    name = f"t{next(_databases)}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}".encode())
    return postgres_dsn.rsplit("/", 1)[0] + "/" + name
