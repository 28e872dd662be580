import os
import sys

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from reviewapp.static_manifest import require_static_manifest

ASGI_APP = "reviewapp.asgi:application"


class Command(BaseCommand):
    help = (
        "Run the web process (dashboard, API, gateway) under uvicorn. With DJANGO_DEBUG=false it "
        "collects the static files into STATIC_ROOT first: production serves them from there "
        "with hashed names, and a page whose files were never collected would answer 500."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--workers",
            type=int,
            default=int(os.environ.get("WEB_WORKERS", "1")),
            help="uvicorn worker processes (about one per core)",
        )

    def handle(self, *args, host, port, workers, **options):
        if not settings.DEBUG:
            self._collect_static()
        try:
            require_static_manifest()  # what each web worker checks as it imports the app
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from None
        command = [
            sys.executable, "-m", "uvicorn", ASGI_APP,
            "--host", host, "--port", str(port), "--workers", str(workers),
            # TLS ends at the proxy in front; its X-Forwarded-* headers name the client.
            "--proxy-headers",
        ]  # fmt: skip
        self.stdout.write(f"starting {workers} web worker(s) on {host}:{port}")
        self.stdout.flush()
        # exec: the process manager's signals reach uvicorn directly.
        os.execv(command[0], command)

    def _collect_static(self) -> None:
        try:
            call_command("collectstatic", interactive=False, verbosity=0)
        except OSError as error:
            raise CommandError(
                f"could not collect static files into {settings.STATIC_ROOT} ({error}). Run "
                "`python manage.py collectstatic --noinput` as a user who may write there, or "
                "point DJANGO_STATIC_ROOT at a writable directory, then start again."
            ) from None
