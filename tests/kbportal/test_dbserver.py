"""``manage.py dbserver status|stop`` look at the embedded server without starting it."""

import os
import subprocess
import sys
from pathlib import Path

from kbportal.db import embedded_database_status, ensure_embedded_database

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
