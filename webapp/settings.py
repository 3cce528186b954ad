"""Settings for the InTune control plane, read from environment variables with safe defaults.

Every variable is listed with its default in README.md ("Configuration").
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from agents import protocol

from .env import envbool, envfloat, envint, envlist
from .redis_urls import for_celery, for_redis_py

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.getenv("INTUNE_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = envbool("DJANGO_DEBUG", False)
_DEFAULT_DEV_KEY = "insecure-dev-key-set-DJANGO_SECRET_KEY-in-production"
SECRET_KEY = os.getenv("DJANGO_SECRET_KEY", _DEFAULT_DEV_KEY)
ALLOWED_HOSTS = envlist("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1],testserver")
CSRF_TRUSTED_ORIGINS = envlist("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "webapp.jobs",
    "webapp.ingestion",
    "webapp.tuning",
    "webapp.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "webapp.parsers.BodySizeLimitMiddleware",
    "webapp.database_guard.DatabaseUnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "webapp.slashes.SlashRedirectKeepingMethod",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "webapp" / "templates"],
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

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{VAR_DIR / 'intune.sqlite3'}",
        conn_max_age=envint("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A bounded pool per process: gunicorn runs many threads (agents' long-polls hold one each
    # while they wait), and one connection per thread would exhaust PostgreSQL's
    # max_connections. A request borrows a connection and returns it when it ends.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # With a pool this makes it check a connection before lending it: after a PostgreSQL
    # restart the pooled ones are dead, and the first request must not be the one to find out.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        # The pool grows one connection at a time. In an in-step run on a loaded machine (load
        # 29 on 2 cores) 2 batches of 2,400 waited out the timeout below and were answered 503
        # ("couldn't get a connection after 3.00 sec"), most likely queued on that growth while
        # a burst met a process holding one connection. Web processes open a connection per
        # thread up front (webapp/gunicorn_conf.py sets this); others keep one.
        "min_size": min(envint("INTUNE_DB_POOL_MIN_SIZE", 1), envint("INTUNE_DB_POOL_SIZE", 16)),
        "max_size": envint("INTUNE_DB_POOL_SIZE", 16),
        # How long a request waits for a connection: short, so that while PostgreSQL is down
        # requests fail fast with a 503 instead of hanging.
        "timeout": envfloat("INTUNE_DB_POOL_TIMEOUT_S", 3.0),
    }
    # After PostgreSQL comes back the pool reconnects within this many seconds, not after a
    # delay that doubled through the outage (webapp/pool_guard.py).
    DB_RECONNECT_DELAY_MAX_S = envfloat("INTUNE_DB_RECONNECT_DELAY_MAX_S", 2.0)
    if DB_RECONNECT_DELAY_MAX_S <= 0:
        raise ImproperlyConfigured(
            f"INTUNE_DB_RECONNECT_DELAY_MAX_S={DB_RECONNECT_DELAY_MAX_S:g}: give a bound in seconds"
        )
    from .pool_guard import install as install_pool_guard

    install_pool_guard(DB_RECONNECT_DELAY_MAX_S)
    # Row locks are waited for a bounded time. A transaction that holds a row and never ends (a
    # Celery tuning step frozen in create_allocation with its host row locked, a web thread
    # stuck mid-request) otherwise held every request locking or updating that row (an
    # override, a batch reporting a new allocation status, the batch's host update) forever.
    # Past the bound the statement fails with SQLSTATE 55P03 and the request answers 503 with
    # Retry-After, naming the lock (webapp/database_guard.py); a tuning step retries. A
    # transaction left idle that long (its client stopped, swapping, SIGSTOPped) is ended by
    # the server, so the lock it held is released: no InTune transaction waits on its client
    # for more than milliseconds (a tuning step's decision runs in its transaction: under 5 ms,
    # benchmarks/decision_time.py; pretraining runs outside one).
    DB_LOCK_TIMEOUT_S = envfloat("INTUNE_DB_LOCK_TIMEOUT_S", 5.0)
    DB_IDLE_IN_TRANSACTION_TIMEOUT_S = envfloat("INTUNE_DB_IDLE_IN_TRANSACTION_TIMEOUT_S", 60.0)
    for _name, _value in (
        ("INTUNE_DB_LOCK_TIMEOUT_S", DB_LOCK_TIMEOUT_S),
        ("INTUNE_DB_IDLE_IN_TRANSACTION_TIMEOUT_S", DB_IDLE_IN_TRANSACTION_TIMEOUT_S),
    ):
        if _value <= 0:
            raise ImproperlyConfigured(
                f"{_name}={_value:g} would let a request wait forever: give a bound in seconds"
            )
    DATABASES["default"]["OPTIONS"]["options"] = " ".join(
        filter(
            None,
            (
                DATABASES["default"]["OPTIONS"].get("options"),  # the URL's own, if any
                f"-c lock_timeout={round(DB_LOCK_TIMEOUT_S * 1000)}",
                "-c idle_in_transaction_session_timeout="
                f"{round(DB_IDLE_IN_TRANSACTION_TIMEOUT_S * 1000)}",
            ),
        )
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web threads, Celery) write to one file: WAL lets readers go on while one
    # writes, and IMMEDIATE transactions queue writers on the busy timeout instead of failing.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Set where collectstatic writes (the Docker image does); unset, files are served from static/.
STATIC_ROOT = os.getenv("INTUNE_STATIC_ROOT") or None
# WhiteNoise serves static/ straight from the finders, so neither the demo nor the tests need
# collectstatic; production images run collectstatic and get compressed, hashed files.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- Redis: Celery's broker and the pub/sub that wakes agents' long-polls -------------------
REDIS_URL = os.getenv("REDIS_URL", f"unix://{VAR_DIR / 'redis.sock'}")
REDIS_CLIENT_URL = for_redis_py(REDIS_URL)
# Prefixes every key and channel InTune uses, so that several deployments (or test stacks) can
# share one Redis server without reading each other's tasks or allocations.
REDIS_KEY_PREFIX = os.getenv("INTUNE_REDIS_PREFIX", "intune")

CELERY_BROKER_URL = for_celery(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TIMEZONE = "UTC"
# A worker killed mid-task must not lose the task: acknowledge after it ran, and requeue it when
# the worker process dies. Tasks are idempotent (each tuning step checks its step number).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": envint("CELERY_VISIBILITY_TIMEOUT", 120),
    "global_keyprefix": f"{REDIS_KEY_PREFIX}:celery:",
}
CELERY_TASK_DEFAULT_QUEUE = REDIS_KEY_PREFIX
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_CONCURRENCY = envint("INTUNE_WORKER_CONCURRENCY", 2)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

CELERY_BEAT_SCHEDULE = {
    "mark-silent-agents-offline": {
        "task": "webapp.jobs.tasks.mark_silent_hosts_offline",
        "schedule": 5.0,
    },
    "expire-overrides": {"task": "webapp.tuning.tasks.expire_overrides", "schedule": 5.0},
    "resume-stalled-sessions": {
        "task": "webapp.tuning.tasks.resume_stalled_sessions",
        "schedule": 2.0,
    },
    "roll-up-samples": {
        "task": "webapp.ingestion.tasks.roll_up_and_expire_samples",
        "schedule": 300.0,
    },
    "fit-twins": {"task": "webapp.tuning.tasks.fit_twins", "schedule": 600.0},
    "send-alerts": {"task": "webapp.dashboard.tasks.send_alerts", "schedule": 10.0},
}

# --- InTune's own knobs -----------------------------------------------------------------------
INTUNE = {
    # An agent silent this long is shown offline.
    "AGENT_OFFLINE_AFTER_S": envfloat("INTUNE_AGENT_OFFLINE_AFTER_S", 15.0),
    # Seconds of fresh metrics between two decisions of a tuning session.
    "DECISION_INTERVAL_S": envfloat("INTUNE_DECISION_INTERVAL_S", 5.0),
    # A running session whose tasks have been silent this long is started again (worker died).
    "STALLED_AFTER_S": envfloat("INTUNE_STALLED_AFTER_S", 15.0),
    # The longest an allocation long-poll may hold.
    "LONG_POLL_MAX_WAIT_S": envfloat("INTUNE_LONG_POLL_MAX_WAIT_S", 60.0),
    # Raw 1 Hz samples older than this are rolled up into coarser ones.
    "RAW_RETENTION_S": envfloat("INTUNE_RAW_RETENTION_S", 6 * 3600.0),
    # Roll-up resolution and how long rolled-up samples are kept.
    "ROLLUP_STEP_S": envint("INTUNE_ROLLUP_STEP_S", 60),
    "ROLLUP_RETENTION_S": envfloat("INTUNE_ROLLUP_RETENTION_S", 30 * 86400.0),
    # How far ahead of this server's clock a sample's ts may be; a later one refuses its batch
    # with a 400 naming the sample (docs/agent-protocol.md, "Clocks"). Trainer hosts' clocks
    # drift; NTP keeps them within milliseconds, an unsynced one drifts seconds a day.
    "MAX_CLOCK_SKEW_S": envfloat("INTUNE_MAX_CLOCK_SKEW_S", 300.0),
    # Most samples in one batch, and most points per series in an answer.
    "MAX_SAMPLES_PER_BATCH": envint("INTUNE_MAX_SAMPLES_PER_BATCH", protocol.MAX_SAMPLES_PER_BATCH),
    "MAX_POINTS_PER_SERIES": envint("INTUNE_MAX_POINTS_PER_SERIES", 1000),
    # Alerts on the dashboard (and the optional webhook).
    "ALERT_THROUGHPUT_DROP": envfloat("INTUNE_ALERT_THROUGHPUT_DROP", 0.3),
    "ALERT_IDLE_ABOVE": envfloat("INTUNE_ALERT_IDLE_ABOVE", 0.5),
    "ALERT_WEBHOOK_URL": os.getenv("INTUNE_ALERT_WEBHOOK_URL", ""),
    # An agent silent this long raises an alert; throughput is compared over the last window
    # against the baseline before it.
    "ALERT_SILENT_AFTER_S": envfloat(
        "INTUNE_ALERT_SILENT_AFTER_S", envfloat("INTUNE_AGENT_OFFLINE_AFTER_S", 15.0)
    ),
    "ALERT_WINDOW_S": envfloat("INTUNE_ALERT_WINDOW_S", 30.0),
    "ALERT_BASELINE_S": envfloat("INTUNE_ALERT_BASELINE_S", 600.0),
}
if INTUNE["MAX_CLOCK_SKEW_S"] < 0:
    raise ImproperlyConfigured(
        f"INTUNE_MAX_CLOCK_SKEW_S={INTUNE['MAX_CLOCK_SKEW_S']:g} would refuse every sample: give "
        "the seconds a sample's ts may be ahead of this server's clock, e.g. 300"
    )
DATA_UPLOAD_MAX_MEMORY_SIZE = envint("INTUNE_MAX_BODY_BYTES", protocol.MAX_BODY_BYTES)
# Agents' usual batches stored by webapp/ingestion/api/lean.py ahead of Django and DRF (about
# half the CPU of a request); off, Django's view stores every batch. Its answers are the same.
INTUNE_LEAN_INGESTION = envbool("INTUNE_LEAN_INGESTION", True)
# The agent token lookup and a batch's statement are prepared once per PostgreSQL connection
# (webapp/ingestion/inserts.py); off behind a proxy that pools by transaction (PgBouncer).
INTUNE_DB_PREPARED_STATEMENTS = envbool("INTUNE_DB_PREPARED_STATEMENTS", True)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["webapp.parsers.SafeJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "webapp.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "webapp.api_errors.json_exception_handler",
    "DEFAULT_THROTTLE_RATES": {
        "login": os.getenv("INTUNE_LOGIN_RATE", "20/min"),
        "agent": os.getenv("INTUNE_AGENT_RATE", "600/min"),
    },
}
SPECTACULAR_SETTINGS = {
    "TITLE": "InTune control plane API",
    "DESCRIPTION": "Jobs, hosts, agents' metrics, allocations, tuning sessions and overrides.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Every operation documents the errors it can answer with (webapp/api_schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "webapp.api_schema.document_errors",
        "webapp.api_schema.refuse_unknown_fields",
        "webapp.jobs.api.tuning_options.job_rules_across_fields",
    ],
}

# Throttle counters live in each process's memory: a Redis outage must not turn every request
# into an error (the rates are per web process, which is what a rate limit needs to protect it).
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Security: strict unless DEBUG ------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the dashboard's JS reads it to send X-CSRFToken
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Load balancers probe /healthz over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
if envbool("INTUNE_BEHIND_TLS_PROXY", False):
    # TLS ends at a proxy that says so in X-Forwarded-Proto (set it only behind such a proxy).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if not DEBUG:
    # Production means HTTPS: secure cookies, HTTP redirected to HTTPS, HSTS for a year. The
    # demo, docker-compose and the tests serve plain http://127.0.0.1 with
    # INTUNE_SECURE_COOKIES=False, which turns all three off unless they are set on their own.
    _HTTPS = envbool("INTUNE_SECURE_COOKIES", True)
    SESSION_COOKIE_SECURE = _HTTPS
    CSRF_COOKIE_SECURE = _HTTPS
    SECURE_SSL_REDIRECT = envbool("INTUNE_SSL_REDIRECT", _HTTPS)
    SECURE_HSTS_SECONDS = envint("INTUNE_HSTS_SECONDS", 31_536_000 if _HTTPS else 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("INTUNE_HSTS_INCLUDE_SUBDOMAINS", _HTTPS)
    SECURE_HSTS_PRELOAD = envbool("INTUNE_HSTS_PRELOAD", _HTTPS)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # One line per record (exceptions as standard tracebacks), as the agent logs: agents/logs.py.
    "formatters": {"plain": {"()": "agents.logs.OneLineFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.getenv("INTUNE_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
