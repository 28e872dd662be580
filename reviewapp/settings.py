"""Settings, all from the environment; the defaults run on a fresh laptop with nothing installed."""

from datetime import timedelta
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")  # optional; a missing file is fine

# The embedded run keeps its state here: SQLite, the file broker's folders, adapters.
VAR_DIR = Path(env.str("APPRENTICE_VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = env.bool("DJANGO_DEBUG", default=True)
SECRET_KEY = env.str(
    "DJANGO_SECRET_KEY",
    # Only usable with DEBUG on: production must supply its own (check --deploy insists).
    default="insecure-embedded-default-key-set-DJANGO_SECRET_KEY-in-production-0123456789",
)
# Production refuses to start on the key everyone can read in the source.
if not DEBUG and SECRET_KEY.startswith("insecure-embedded-default-key"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is false")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "csp",
    "template_partials",
    "axes",
    "ninja",  # /api/v1/docs: Swagger UI from ninja's own static files, not a CDN
    "reviewapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "reviewapp.api.limits.RequestSizeLimitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "csp.middleware.CSPMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires
]
# What of MIDDLEWARE applies to a gateway call (/v1/chat/completions, /v1/models), same order:
# no sessions, auth, CSRF (the views are exempt), messages, htmx or axes. Run in the event loop
# by reviewapp/gateway/asgi.py; each must only read the request and set headers.
GATEWAY_MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "reviewapp.api.limits.RequestSizeLimitMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]

ROOT_URLCONF = "reviewapp.urls"
ASGI_APPLICATION = "reviewapp.asgi.application"
WSGI_APPLICATION = "reviewapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "builtins": ["template_partials.templatetags.partials"],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "reviewapp.context_processors.nav",
            ],
        },
    },
]

DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'apprentice.sqlite3'}")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while the worker writes.
    DATABASES["default"].setdefault("OPTIONS", {})["init_command"] = "PRAGMA journal_mode=WAL;"
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)
# A connection kept across requests is checked before reuse, so a restarted database costs the
# requests in flight at that moment, not every request until the web process restarts.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Login throttling (django-axes), the admin login included (reviewapp/lockout.py). After
# LOGIN_FAILURE_LIMIT wrong passwords for one account from one address, that address is refused
# (429, the right password too) for that account until LOGIN_LOCKOUT_MINUTES after the last
# failure; the owner elsewhere still logs in, so a stranger cannot lock them out. An address with
# LOGIN_ADDRESS_FAILURE_LIMIT failures over any accounts (spraying a password) is refused for all.
# Behind a proxy every client shares its address: set AXES_IPWARE_PROXY_COUNT (with
# django-ipware) so the real client address is used.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_ADDRESS_FAILURE_LIMIT = env.int("LOGIN_ADDRESS_FAILURE_LIMIT", default=50)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]  # for axes' own tools; see lockout.py
AXES_HANDLER = "reviewapp.lockout.LockoutHandler"
AXES_LOCKOUT_CALLABLE = "reviewapp.lockout.lockout_response"
# A refused try does not restart the cooloff, so the time the locked page states holds.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False

# Enforced, not report-only: no inline script or style, nothing from another origin. Untrusted
# text from traces that slipped past escaping still could not run.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    }
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Production serves static files from here: `manage.py serve_web` collects them before starting.
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", default=str(BASE_DIR / "staticfiles")))
# Served by the web process itself (whitenoise): one command runs everything.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# Celery. Embedded default: a broker on the filesystem, so nothing has to be running.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
TASK_VISIBILITY_TIMEOUT_SECONDS = env.int("CELERY_VISIBILITY_TIMEOUT", default=4 * 3600)
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {
        "data_folder_in": str(VAR_DIR / "broker"),
        "data_folder_out": str(VAR_DIR / "broker"),
        "processed_folder": str(VAR_DIR / "broker-processed"),
        "control_folder": str(VAR_DIR / "broker-control"),
        "store_processed": False,
    }
    if CELERY_BROKER_URL.startswith("filesystem")
    else {
        # Redis hands a task whose worker died unacknowledged to another worker after this
        # long: longer than any task should take (training claims its run, so a second
        # delivery of it does nothing)...
        "visibility_timeout": TASK_VISIBILITY_TIMEOUT_SECONDS,
        # ...checking for such tasks every few seconds (kombu's default is every 100 s).
        "unacked_restore_interval": max(1, min(10, TASK_VISIBILITY_TIMEOUT_SECONDS // 4)),
        "unacked_restore_throttle": 1,
    }
)
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-task leaves the message for another worker
# ...and a pool process killed mid-task (SIGKILL, out of memory) requeues it instead of failing it.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A broker restart of a few seconds delays an enqueue instead of failing the request behind it.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 20,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 1,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A run whose worker has not reported for this long is failed (its worker died).
TRAINING_HEARTBEAT_TIMEOUT_SECONDS = env.int("TRAINING_HEARTBEAT_TIMEOUT_SECONDS", default=600)
CELERY_TASK_DEFAULT_QUEUE = "default"
# Tasks are sent by name (reviewapp/jobs.py) from processes that never import them, so a task's
# queue is given here, by its name, not on its decorator; every task not listed goes to `default`.
CELERY_TASK_ROUTES = {"training.run_training": {"queue": "gpu"}}

# Ingest limits: big enough for real agent traces, small enough that one request can't hurt.
INGEST_MAX_BODY_BYTES = env.int("INGEST_MAX_BODY_BYTES", default=32 * 1024 * 1024)
INGEST_MAX_TRACES_PER_BATCH = env.int("INGEST_MAX_TRACES_PER_BATCH", default=1000)
INGEST_MAX_MESSAGES_PER_TRACE = env.int("INGEST_MAX_MESSAGES_PER_TRACE", default=20000)
INGEST_MAX_NESTING_DEPTH = env.int("INGEST_MAX_NESTING_DEPTH", default=32)
# Admission limits, per web process: past these many requests in flight, more are answered
# 503 with Retry-After at once instead of queueing until the client times out.
# Ingest is CPU-bound under one interpreter lock: past a few in flight, more only add latency.
INGEST_MAX_IN_FLIGHT = env.int("INGEST_MAX_IN_FLIGHT", default=8)
GATEWAY_MAX_IN_FLIGHT = env.int("GATEWAY_MAX_IN_FLIGHT", default=256)
ADMISSION_RETRY_AFTER_SECONDS = env.int("ADMISSION_RETRY_AFTER_SECONDS", default=1)
# Django's own cap would answer 400 before ours could answer 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = INGEST_MAX_BODY_BYTES

# The model server(s) the gateway forwards to when a project names none of its own. bin/run
# starts vLLM's CPU build here unless VLLM_URL points at a running server.
VLLM_URL = env.str("VLLM_URL", default="http://127.0.0.1:8100/v1")
# Where `serve_model` keeps vLLM's own virtualenv and the converted base model.
VLLM_VENV = Path(env.str("VLLM_VENV", default=str(BASE_DIR / ".venv-vllm")))
MODEL_CACHE_DIR = Path(env.str("MODEL_CACHE_DIR", default=str(VAR_DIR / "models")))
BASE_MODEL = env.str("BASE_MODEL", default="SmolLM2-135M-Instruct")
# Trained adapters, one immutable directory each; vLLM must be able to read this path.
ADAPTERS_DIR = Path(env.str("ADAPTERS_DIR", default=str(VAR_DIR / "adapters")))
# Sent only to MODEL_SERVERS; never the harness's key.
VLLM_API_KEY = env.str("VLLM_API_KEY", default="")
# What a project's settings may reach (reviewapp/projects/outbound.py), the operator's choice:
# the model servers a project may list in `upstreams` or name as its teacher (comma-separated
# base URLs; a project's own upstream_url, set by the operator, is allowed to it too)...
MODEL_SERVERS = env.list("MODEL_SERVERS", default=[VLLM_URL])
# ...other OpenAI-compatible endpoints a project may name as its teacher...
TEACHER_SERVERS = env.list("TEACHER_SERVERS", default=[])
# ...and the keys a teacher may be given, by name: "frontier=FRONTIER_API_KEY,..." maps the
# name a project picks to the environment variable holding the secret. No other variable is read.
TEACHER_API_KEYS = env.dict("TEACHER_API_KEYS", default={})
GATEWAY_CONNECT_TIMEOUT = env.float("GATEWAY_CONNECT_TIMEOUT", default=5.0)
GATEWAY_READ_TIMEOUT = env.float("GATEWAY_READ_TIMEOUT", default=300.0)
# A model server that failed a call (unreachable, timed out, 502/503/504) gets no calls from
# this web process for this long; then it is tried again.
GATEWAY_UPSTREAM_COOLDOWN_SECONDS = env.float("GATEWAY_UPSTREAM_COOLDOWN_SECONDS", default=10.0)
# How many of a project's model servers must load an adapter before the route moves to it;
# 0: all of them. A server that missed it loads it on its first call (the gateway reloads it).
DEPLOY_QUORUM = env.int("DEPLOY_QUORUM", default=0)
# A call whose messages extend a gateway trace this recent joins it (prefix merging).
GATEWAY_MERGE_WINDOW_SECONDS = env.int("GATEWAY_MERGE_WINDOW_SECONDS", default=3600)
# A gateway trace is triaged and embedded once no call has joined it for this long (an
# episode's end), not after every call.
GATEWAY_QUIET_SECONDS = env.float("GATEWAY_QUIET_SECONDS", default=60.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}

if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
    SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
