"""``manage.py dbserver status|stop`` look at the embedded server without starting it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbportal.db import embedded_database_status, ensure_embedded_database

pytestmark = pytest.mark.slow  # starts and stops PostgreSQL servers

ROOT = Path(__file__).resolve().parents[2]


def _dbserver(action: str, pgdata: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "DATABASE_OWNER_URL"}}
    env["KB_PGDATA"] = str(pgdata)
    env.pop("XDG_RUNTIME_DIR", None)  # unset, as on the CI machine: platformdirs warns, we do not show it
    proc = subprocess.run(
        [sys.executable, "manage.py", "dbserver", action],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # the newcomer saw a RuntimeDirWarning here
    return proc.stdout


def test_status_and_stop_never_start_the_server(tmp_path):
    pgdata = tmp_path / "pgdata"
    assert "not running" in _dbserver("status", pgdata)
    assert embedded_database_status(pgdata) is None  # asking did not start it
    ensure_embedded_database(pgdata)
    try:
        status = _dbserver("status", pgdata)
        assert "running, pid" in status
        # The embedded server listens on its socket only; status says so rather than naming a port.
        assert f"socket {pgdata.resolve()}" in status and "/.s.PGSQL." in status and "(no TCP listener)" in status
        assert _dbserver("stop", pgdata).strip() == "stopped"
        assert "not running" in _dbserver("status", pgdata)
        assert embedded_database_status(pgdata) is None
        assert _dbserver("stop", pgdata).strip() == "was not running"
    finally:
        if embedded_database_status(pgdata) is not None:
            from kbportal.db import stop_embedded_database

            stop_embedded_database(pgdata)


def _fake_pgdata(tmp_path: Path, lines: list[str]) -> Path:
    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    (pgdata / "postmaster.pid").write_text("\n".join(lines) + "\n")
    return pgdata


def _dbserver_status(monkeypatch, pgdata: Path) -> str:
    from io import StringIO

    from django.core.management import call_command

    monkeypatch.setenv("KB_PGDATA", str(pgdata))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    out = StringIO()
    call_command("dbserver", "status", stdout=out)
    return out.getvalue()


def test_dbserver_status_of_a_server_still_starting_does_not_crash(tmp_path, monkeypatch):
    """Fixed (failed before). PostgreSQL writes
    postmaster.pid's first 5 lines at start and adds lines 6-8 as startup proceeds; the code
    read line 6 only ``if len(lines) > 5``, but ``embedded_database_status`` fails first
    (``PostmasterInfo`` asserts exactly 8 lines): ``dbserver status`` during startup is an
    AssertionError traceback. Only ``status`` is run here, on a fake pid file naming this process."""
    import os

    pgdata = _fake_pgdata(
        tmp_path, [str(os.getpid()), str(tmp_path / "pgdata"), str(int(time.time())), "5432", str(tmp_path)]
    )
    out = _dbserver_status(monkeypatch, pgdata)
    assert "embedded PostgreSQL" in out


def test_dbserver_status_names_the_tcp_listener_from_line_6(tmp_path, monkeypatch):
    import os

    head = [str(os.getpid()), str(tmp_path / "pgdata"), str(int(time.time())), "5432", str(tmp_path)]
    pgdata = _fake_pgdata(tmp_path, [*head, "127.0.0.1", "  5432001         0", "ready   "])
    out = _dbserver_status(monkeypatch, pgdata)
    assert f"socket {tmp_path}/.s.PGSQL.5432 (TCP 127.0.0.1:5432)" in out
    (pgdata / "postmaster.pid").write_text("\n".join([*head, "", "  5432001         0", "ready   "]) + "\n")
    assert "(no TCP listener)" in _dbserver_status(monkeypatch, pgdata)
