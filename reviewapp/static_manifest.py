"""With DJANGO_DEBUG=false, pages name their static files through the manifest collectstatic
writes; without it every page answers 500. The web process refuses to start instead, however
it is started (reviewapp/asgi.py, reviewapp/wsgi.py, manage.py serve_web)."""

from django.conf import settings
from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage
from django.core.exceptions import ImproperlyConfigured


def require_static_manifest() -> None:
    """Raise ImproperlyConfigured, saying to run collectstatic, when static files are served
    from a manifest that is not there."""
    if not isinstance(staticfiles_storage, ManifestFilesMixin):
        return  # DJANGO_DEBUG=true: files are served from the source tree as they are
    if not staticfiles_storage.exists(staticfiles_storage.manifest_name):
        raise ImproperlyConfigured(
            f"static files were never collected into {settings.STATIC_ROOT} (no "
            f"{staticfiles_storage.manifest_name}), and with DJANGO_DEBUG=false every page would "
            "answer 500. Run `python manage.py collectstatic --noinput` first (or start the web "
            "process with `python manage.py serve_web`, which collects them), then start again."
        )
