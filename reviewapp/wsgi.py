import os

from django.core.wsgi import get_wsgi_application

from reviewapp.static_manifest import require_static_manifest

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reviewapp.settings")
# With DJANGO_DEBUG=false and static files never collected, refuse to start rather than 500.
require_static_manifest()
application = get_wsgi_application()
