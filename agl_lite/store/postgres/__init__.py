"""The PostgreSQL backend: the store shared by several gateway processes (replicas), on a server of its own.

Three modules, one job each, as the SQLite backend's: `schema` (each version's DDL and the migrations between
them), `repo` (SQLite's storage format and SQL, said in PostgreSQL's dialect), `store` (`PostgresStore`:
serializable transactions with group commit and retries, readers on their own connections). See docs/store.md.
"""

from agl_lite.store.postgres.repo import PostgresRepo
from agl_lite.store.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from agl_lite.store.postgres.store import PostgresStore

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresRepo", "PostgresStore"]
