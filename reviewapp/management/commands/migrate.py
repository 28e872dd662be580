"""Django's `migrate`, then the embedded SQLite database made readable by this user only."""

import os
from pathlib import Path

from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import connections


class Command(DjangoMigrate):
    def handle(self, *args, **options):
        super().handle(*args, **options)
        restrict_to_owner(connections[options["database"]])


def restrict_to_owner(connection) -> None:
    """Make an SQLite database file 0600: it holds every recorded trace and the password hashes.
    SQLite gives the -wal and -shm files it creates later the database file's mode; any left by
    an earlier run are fixed here too. Nothing to do for a server database."""
    if connection.vendor != "sqlite":
        return
    database = Path(connection.settings_dict["NAME"])
    for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
        if path.is_file():
            os.chmod(path, 0o600)
