"""``migrate`` that runs as the table owner (the ``owner`` alias) unless told otherwise.

The app's own role cannot create tables and must not own them (row-level security would not
bind an owner that can disable it), so schema changes go through the owner connection.
"""

from django.core.management.commands.migrate import Command as MigrateCommand


class Command(MigrateCommand):
    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.set_defaults(database="owner")
