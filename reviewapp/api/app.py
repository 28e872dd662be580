"""The JSON API at /api/v1/ (OpenAPI at /api/v1/openapi.json)."""

from ninja import NinjaAPI

from reviewapp.api.errors import StrictJsonParser, install_error_handlers
from reviewapp.gateway import api as gateway
from reviewapp.learning.api import export, runs, targets
from reviewapp.monitors import api as alerts
from reviewapp.projects import api as settings
from reviewapp.projects.key_auth import ProjectKeyAuth
from reviewapp.projects.models import KeyScope
from reviewapp.review import api as review
from reviewapp.traces.api import otel
from reviewapp.workbench import api as traces

api = NinjaAPI(
    title="Apprentice API",
    version="1",
    description="Record agent traces, pin feedback to them, and retrain the model from it.",
    # Each route names its scopes (auth.requires); one that forgets is for admin keys only.
    auth=ProjectKeyAuth(KeyScope.ADMIN),
    parser=StrictJsonParser(),
    urls_namespace="api",
    # Swagger UI with ninja's own static files ("ninja" in INSTALLED_APPS), so the CSP's
    # script-src 'self' lets it run; without the app, ninja would load it from a CDN.
    docs_url="/docs",
)
install_error_handlers(api)
api.add_router("/", traces.router)
api.add_router("/", otel.router)
api.add_router("/", export.router)
api.add_router("/", runs.router)
api.add_router("/", alerts.router)
api.add_router("/", settings.router)
api.add_router("/", review.router)
api.add_router("/", targets.router)
api.add_router("/", gateway.router)
