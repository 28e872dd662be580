import gc
import os
from importlib import import_module

from django.conf import settings
from django.core.asgi import get_asgi_application

from reviewapp.api.limits import AdmissionLimit
from reviewapp.gateway.asgi import GatewayRouter
from reviewapp.static_manifest import require_static_manifest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reviewapp.settings")
# With DJANGO_DEBUG=false and static files never collected, refuse to start rather than 500.
require_static_manifest()
# Past the admission limits an overloaded process answers 503 before Django sees the request.
# The gateway's URLs skip the site's middleware stack (reviewapp/gateway/asgi.py).
application = AdmissionLimit(GatewayRouter(get_asgi_application()))

# Load every view now, then move the ~120k objects that live for the whole process out of the
# garbage collector's reach: each full collection used to rescan them, 40% of an ingest batch's
# CPU (bench/ingest.py).
import_module(settings.ROOT_URLCONF)
gc.collect()
gc.freeze()
