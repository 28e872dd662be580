"""With DJANGO_DEBUG=false the web application refuses to load until the static files were
collected, however it is started (uvicorn reviewapp.asgi:application, a WSGI server): it would
otherwise answer 500 on every page. Each case imports the module in a fresh interpreter."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_ENV = {
    "DJANGO_DEBUG": "false",
    "DJANGO_SECRET_KEY": "test-only-production-secret-key-0123456789-abcdefghijklmnopqrstuv",
    "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
}


def import_in_a_new_process(module: str, static_root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        cwd=REPO_ROOT,
        env={**os.environ, **PRODUCTION_ENV, "DJANGO_STATIC_ROOT": str(static_root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("module", ["reviewapp.asgi", "reviewapp.wsgi"])
def test_the_application_refuses_to_load_without_collected_static_files(tmp_path, module):
    loaded = import_in_a_new_process(module, tmp_path)

    assert loaded.returncode != 0
    assert "ImproperlyConfigured" in loaded.stderr
    assert "python manage.py collectstatic --noinput" in loaded.stderr


@pytest.mark.parametrize("module", ["reviewapp.asgi", "reviewapp.wsgi"])
def test_the_application_loads_once_the_manifest_is_there(tmp_path, module):
    manifest = {"paths": {}, "version": "1.1", "hash": ""}  # what collectstatic writes, empty
    (tmp_path / "staticfiles.json").write_text(json.dumps(manifest))

    loaded = import_in_a_new_process(module, tmp_path)

    assert loaded.returncode == 0, loaded.stderr
