"""Every store test runs against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agl_lite.store.memory import MemoryStore
from agl_lite.store.rules import Store
from agl_lite.store.sqlite import SQLiteStore


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else await SQLiteStore.open(tmp_path / "store.db")
    try:
        yield s
    finally:
        await s.close()
