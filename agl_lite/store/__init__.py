"""The rollout store: records, state machines and backends (SQLite, memory) behind one async interface."""
