"""The scratch PostgreSQL database every benchmark creates for itself and drops at the end."""

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def recreate_database(admin_url: str, name: str) -> None:
    drop_database(admin_url, name)
    with psycopg.connect(admin_url, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@contextmanager
def scratch_database(admin_url: str, name: str) -> Iterator[None]:
    """A fresh database `name` for the block, dropped after it (Django's connections to it are
    closed first, when the block opened any)."""
    recreate_database(admin_url, name)
    try:
        yield
    finally:
        if "django.db" in sys.modules:
            from django.db import connections

            connections.close_all()
        drop_database(admin_url, name)


def add_admin_url_argument(parser) -> None:
    """--admin-url: the existing database every benchmark creates its scratch database from."""
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(
            "BENCH_ADMIN_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
        ),
        help="an existing database to create the scratch one from (env BENCH_ADMIN_DATABASE_URL)",
    )


def scratch_database_url(admin_url: str, name: str) -> str:
    """The scratch database's URL: the admin URL with the database name replaced."""
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))
