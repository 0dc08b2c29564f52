"""The job store: every job and its history, durable before it is acknowledged.

`JobStore(where)` (jobstore.py) is the store's one logic; `where` picks the database:
a SQLite file path (sqlite.py, the default `STATE_DIR/jobs.sqlite`), or a
`postgresql://` URL (postgres.py), a server several orchestrator replicas share. Both
hold the same tables (schema.py) and meet one interface (backend.py).
"""

from rdurack.orchestrator.store.jobstore import Event, JobStore

__all__ = ["Event", "JobStore"]
