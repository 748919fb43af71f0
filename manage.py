#!/usr/bin/env python
"""Django's command-line utility for kbportal."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kbportal.settings")
    if sys.argv[1:2] == ["dbserver"]:  # looking at or stopping the server must not start it
        os.environ["KB_DB_NO_START"] = "1"
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
