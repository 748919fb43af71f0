"""``manage.py dbserver status|stop``: the embedded PostgreSQL server in ``.pgdata/``.

Any other ``manage.py`` command (and the web server and worker) starts it when needed; it
keeps running afterwards so they all share it. ``status`` says whether it runs (without
starting it); ``stop`` shuts it down (fast mode).
"""

import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from kbportal.db import ServerStarting, embedded_database_status, stop_embedded_database


class Command(BaseCommand):
    help = "Show or stop the embedded PostgreSQL server (not used when DATABASE_URL is set)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["status", "stop"])

    def handle(self, *args, action, **options):
        if os.environ.get("DATABASE_URL"):
            raise CommandError("DATABASE_URL is set: the database is external, not embedded")
        pgdata = Path(os.environ.get("KB_PGDATA", Path(settings.BASE_DIR) / ".pgdata")).resolve()
        if action == "status":
            try:
                status = embedded_database_status(pgdata)
            except ServerStarting as exc:
                self.stdout.write(f"embedded PostgreSQL: starting or stopping ({exc})")
                return
            if status is None:
                self.stdout.write(f"embedded PostgreSQL: not running (data {pgdata})")
            else:
                socket_dir, port, pid, tcp = status
                where = f"TCP {tcp}:{port}" if tcp else "no TCP listener"
                self.stdout.write(
                    f"embedded PostgreSQL: running, pid {pid}, data {pgdata}, "
                    f"socket {Path(socket_dir) / f'.s.PGSQL.{port}'} ({where})"
                )
            return
        stopped = stop_embedded_database(pgdata)
        self.stdout.write("stopped" if stopped else "was not running")
