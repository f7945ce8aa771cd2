"""The SQLite backend (embedded default): WAL, one writer with group commit, readers on their own connections.

Three modules, one job each: `schema` (each version's DDL and the migrations between them), `repo` (the storage
format and its SQL, on one connection), `store` (`SQLiteStore`: transactions, group commit, the writer thread,
readers, WAL checkpoints). See docs/store.md.
"""

from agl_lite.store.sqlite.repo import SQLiteRepo
from agl_lite.store.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from agl_lite.store.sqlite.store import SQLiteStore

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQLiteRepo", "SQLiteStore"]
