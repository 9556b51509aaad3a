"""Django settings, read strictly from the environment (docs/deploy.md, "Settings").

`make run` and `make test` set DATABASE_URL, REDIS_URL and SECRET_KEY themselves when they
start the embedded services; a deployment sets them explicitly.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from anex.env import Env, loopback_host

BASE_DIR = Path(__file__).resolve().parent.parent
env = Env()

DEBUG = env.boolean("DEBUG", False)
# Secrets are checked at start (anex.env.secret_check): a placeholder left from
# .env.example (CHANGEME…) is refused whatever the mode. With DEBUG off, which is every
# deployment and also `make run` and `make test` (their launcher makes a 64-character
# key), SECRET_KEY meets `check --deploy`'s own bar (security.W009: 50 characters, 5
# different ones) and a password in a service URL or the S3 secret has at least
# PASSWORD_MIN_LENGTH characters; DEBUG on keeps the looser 32 of a developer's machine.
PASSWORD_MIN_LENGTH = 0 if DEBUG else 16
SECRET_KEY = env.secret("SECRET_KEY", min_length=32 if DEBUG else 50,
                        min_distinct=1 if DEBUG else 5)
# Encrypts the secrets we must read back (webhook signing secrets); derived from
# SECRET_KEY when unset. Set it explicitly in a deployment and never rotate it casually.
ANEX_ENCRYPTION_KEY = env.optional_str("ANEX_ENCRYPTION_KEY")
if ANEX_ENCRYPTION_KEY is not None:
    env.secret("ANEX_ENCRYPTION_KEY", min_length=32)

# Region API origins (docs/dev/decisions/2026-12-01-data-residency.md): one deployment answers both
# hosts, and the host a request reached decides which region's data it may read or store.
ANEX_API_ORIGIN = env.origin("ANEX_API_ORIGIN", "https://api.anex.sh")
ANEX_EU_API_ORIGIN = env.origin("ANEX_EU_API_ORIGIN", "https://api-eu.anex.sh")
if urlsplit(ANEX_API_ORIGIN).hostname == urlsplit(ANEX_EU_API_ORIGIN).hostname:
    raise ImproperlyConfigured(
        "ANEX_API_ORIGIN and ANEX_EU_API_ORIGIN must name different hosts: the host is how "
        "a request's region is told apart."
    )

# Serve the Django admin on this host only (every other host answers 404 under /admin/).
# Required with DEBUG off (issue 40 L10): a deployment that forgot it served the admin on
# its public API hosts. "*" serves it on every allowed host, a choice that must be made out
# loud: `make run` and the tests make it (anex.devstack), and `check --deploy` warns of it
# (anex.admin_site). None below means every host.
ANEX_ADMIN_HOST: str | None = None
if env.optional_str("ANEX_ADMIN_HOST") != "*":
    ANEX_ADMIN_HOST = env.optional_host("ANEX_ADMIN_HOST")
    if ANEX_ADMIN_HOST is None and not DEBUG:
        raise ImproperlyConfigured(
            "ANEX_ADMIN_HOST is required with DEBUG off: the host the admin is served on, "
            "such as admin.example.com, apart from the API hosts (or * to serve it on every "
            "allowed host, which `check --deploy` warns of).")
    if ANEX_ADMIN_HOST is not None and ANEX_ADMIN_HOST in {
            urlsplit(ANEX_API_ORIGIN).hostname, urlsplit(ANEX_EU_API_ORIGIN).hostname}:
        raise ImproperlyConfigured(
            f"ANEX_ADMIN_HOST={ANEX_ADMIN_HOST!r} is an API host: the admin needs a host of "
            "its own, where the API's callers never look.")

ALLOWED_HOSTS = sorted(
    {
        *env.csv_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"]),
        ANEX_ADMIN_HOST or "",
        urlsplit(ANEX_API_ORIGIN).hostname or "",
        urlsplit(ANEX_EU_API_ORIGIN).hostname or "",
    }
    - {""}
)
CSRF_TRUSTED_ORIGINS = env.csv_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # First, so the Dramatiq broker is set before any app declares an actor.
    "anex.apps.AnexConfig",
    "anex.apps.AnexAdminConfig",  # django.contrib.admin with our site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "allauth",
    "allauth.account",
    "allauth.mfa",
    "console.apps.ConsoleConfig",
    "billing.apps.BillingConfig",
    "jobs.apps.JobsConfig",
    "inference.apps.InferenceConfig",
    "realtime.apps.RealtimeConfig",
    "openai_api.apps.OpenAIApiConfig",
]

MIDDLEWARE = [
    "anex.requestid.RequestIdMiddleware",
    "anex.api.bodylimit.ApiBodyLimitMiddleware",  # before anything reads a body
    # /realtime/v1/ goes on through the rest less the browser's middlewares (anex.internals.lean).
    "anex.internals.lean.LeanApiMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "anex.csp.ContentSecurityPolicyMiddleware",  # every answer: scripts and styles are files
    # A NUL in the path or query, refused before any view looks a value up (anex.api.nul).
    "anex.api.nul.NulRefusalMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
]

ROOT_URLCONF = "anex.urls"
WSGI_APPLICATION = "anex.wsgi.application"

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

DATABASES = {"default": env.database("DATABASE_URL", min_password=PASSWORD_MIN_LENGTH)}
DATABASES["default"]["CONN_MAX_AGE"] = env.integer("DATABASE_CONN_MAX_AGE", 60, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.redis_url("REDIS_URL", min_password=PASSWORD_MIN_LENGTH)
# Django's cache is shared by every web process through Redis: allauth keeps its sign-in
# rate limits there, and a per-process memory cache would let each process count alone.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "anex:cache",
    }
}

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
ACCOUNT_LOGIN_METHODS = {"email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]
# Mandatory: an address nobody proved to own never signs in (nor reaches an organization's
# keys or the admin). allauth's default rate limits apply to sign-in, sign-up and resets.
ACCOUNT_EMAIL_VERIFICATION = env.choice(
    "ACCOUNT_EMAIL_VERIFICATION", "mandatory", ("none", "optional", "mandatory")
)
LOGIN_REDIRECT_URL = "/console/"
# The console (console/accounts.py): a sign-up creates the user's organization, with the
# free grant; optional TOTP two-factor with recovery codes (allauth's MFA, /accounts/2fa/).
ACCOUNT_ADAPTER = "console.accounts.ConsoleAccountAdapter"
# Sign-up hashes the password whether or not the address has an account (console.accounts),
# so its timing does not tell them apart; allauth's sign-up limit (20 a minute per IP
# address) bounds how fast addresses can be tried at all.
ACCOUNT_FORMS = {"signup": "console.accounts.ConsoleSignupForm"}
ACCOUNT_EMAIL_SUBJECT_PREFIX = "[anex] "
ACCOUNT_LOGOUT_REDIRECT_URL = "/"
# What a recent re-authentication may be (within allauth's ACCOUNT_REAUTHENTICATION_TIMEOUT,
# 300 s): allauth's three methods, and a sign-in that just completed, which
# console.accounts records as "sign-in" (issue 40;
# docs/dev/decisions/2026-12-06-a-sign-in-is-a-recent-authentication.md).
ACCOUNT_REAUTHENTICATION_METHODS = ("password", "code", "mfa", "sign-in")
MFA_SUPPORTED_TYPES = ["totp", "recovery_codes"]
# A staff account's authenticator app needs a one-time code issued from a shell besides the
# password (console.accounts, `manage.py staffenrol`; issue 40 L10).
MFA_FORMS = {"activate_totp": "console.accounts.StaffActivateTOTPForm"}
MFA_TOTP_ISSUER = "anex"
EMAIL_BACKEND = env.string("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.string("DEFAULT_FROM_EMAIL", "anex <no-reply@anex.sh>")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env.string("STATIC_ROOT", str(BASE_DIR / ".run" / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve static files straight from the finders when they were not collected (tests, a
# first `make run`), so the admin and the docs are styled either way.
WHITENOISE_USE_FINDERS = True

# Object storage for inputs and results (docs/dev/decisions/2026-12-01-inputs-and-results.md):
# "local" is the embedded default's signed-link backend, "s3" the production one, one bucket a
# region.
ANEX_STORAGE_BACKEND = env.choice("ANEX_STORAGE_BACKEND", "local", ("local", "s3"))
ANEX_STORAGE_ROOT = Path(env.string("ANEX_STORAGE_ROOT", str(BASE_DIR / ".run" / "storage")))
ANEX_S3_BUCKETS: dict[str, str] = {}
ANEX_S3_REGIONS: dict[str, str | None] = {}
ANEX_S3_ENDPOINT_URL = env.optional_str("ANEX_S3_ENDPOINT_URL")
# Where customers reach the storage, when not at ANEX_S3_ENDPOINT_URL (compose: the services
# use http://minio:9000, customers https://<ANEX_STORAGE_HOST> through the proxy): the
# upload targets and download links are signed for it (jobs.storage).
ANEX_S3_PUBLIC_ENDPOINT_URL = env.optional_str("ANEX_S3_PUBLIC_ENDPOINT_URL")
if ANEX_STORAGE_BACKEND == "s3":
    ANEX_S3_BUCKETS = {
        "world": env.string("ANEX_S3_BUCKET", required=True),
        "eu": env.string("ANEX_S3_EU_BUCKET", required=True),
    }
    # The AWS region of each bucket (the EU one must be in the EEA); credentials come
    # from the standard AWS environment variables or the instance role.
    ANEX_S3_REGIONS = {
        "world": env.optional_str("ANEX_S3_REGION"),
        "eu": env.optional_str("ANEX_S3_EU_REGION"),
    }
    if ANEX_S3_ENDPOINT_URL is not None:
        env.origin("ANEX_S3_ENDPOINT_URL", ANEX_S3_ENDPOINT_URL)
    if ANEX_S3_PUBLIC_ENDPOINT_URL is not None:
        env.origin("ANEX_S3_PUBLIC_ENDPOINT_URL", ANEX_S3_PUBLIC_ENDPOINT_URL)
    # boto3 reads the credentials itself; they are checked here like every other secret
    # (unset: the instance role's). The MinIO root login is never the app's: compose
    # gives the app a user of its own, limited to the anex buckets (docs/deploy.md).
    _s3_secret = env.optional_secret("AWS_SECRET_ACCESS_KEY", min_length=PASSWORD_MIN_LENGTH)
    if _s3_secret and _s3_secret == env.optional_str("MINIO_ROOT_PASSWORD"):
        raise ImproperlyConfigured(
            "AWS_SECRET_ACCESS_KEY is MinIO's root password: give the app a MinIO user of "
            "its own, limited to the anex buckets (compose.yaml's minio-init makes one).")

# Signed links (upload targets, download links) are handed to customers, who send files and
# read results through them: with DEBUG off they name https, or a loopback host (`make
# run`'s http://localhost). Their origin is the API's on the local backend, the storage's
# public endpoint on S3 (boto3's default, AWS, is https).
if ANEX_STORAGE_BACKEND == "local":
    _link_origins = {"ANEX_API_ORIGIN": ANEX_API_ORIGIN, "ANEX_EU_API_ORIGIN": ANEX_EU_API_ORIGIN}
elif ANEX_S3_PUBLIC_ENDPOINT_URL:
    _link_origins = {"ANEX_S3_PUBLIC_ENDPOINT_URL": ANEX_S3_PUBLIC_ENDPOINT_URL}
else:
    _link_origins = {"ANEX_S3_ENDPOINT_URL": ANEX_S3_ENDPOINT_URL or "https://s3.amazonaws.com"}
if not DEBUG:
    for _name, _origin in _link_origins.items():
        _parts = urlsplit(_origin)
        if _parts.scheme != "https" and not loopback_host(_parts.hostname or ""):
            raise ImproperlyConfigured(
                f"{_name}={_origin!r}: customers' signed links (uploads and downloads) would "
                "travel in plain http. Use an https origin"
                + (", or set ANEX_S3_PUBLIC_ENDPOINT_URL to the https address customers reach "
                   "the storage at (docs/deploy.md)." if _name == "ANEX_S3_ENDPOINT_URL"
                   else " (docs/deploy.md)."))

# Which checkpoint serves which model id
# (docs/dev/decisions/2026-12-01-models-limits-and-pricing.md): "model-id=/path/to/checkpoint;…". A
# checkpoint directory holds the model's tokenizer.json, which the estimator counts input tokens
# with.
ANEX_CHECKPOINTS = env.path_mapping("ANEX_CHECKPOINTS")
# What a worker process serves: its models (default: every configured checkpoint) and its
# regions. A GPU worker sets one model; the embedded default's one worker serves all.
ANEX_WORKER_MODELS = env.csv_list("ANEX_WORKER_MODELS", sorted(ANEX_CHECKPOINTS))
# ANEX_WORKER_REGIONS: below, with the worker roles.

# Inputs (the reference's "POST /inputs"): the size cap, the upload window, and how long
# an input is kept after it lands.
ANEX_INPUT_MAX_BYTES = env.integer("ANEX_INPUT_MAX_BYTES", 2 * 1024**3, minimum=1)
ANEX_UPLOAD_WINDOW_SECONDS = env.integer("ANEX_UPLOAD_WINDOW_SECONDS", 3600, minimum=60)
# Upload form POSTs one client address may start per minute on the local storage backend
# (each may carry up to the input cap; S3 throttles its own).
ANEX_UPLOADS_PER_MINUTE = env.integer("ANEX_UPLOADS_PER_MINUTE", 120, minimum=1)
# Preflight checks (POST /checks) one organization may start per minute: each reads and
# tokenizes a whole input on the estimate workers, for free.
ANEX_CHECKS_PER_MINUTE = env.integer("ANEX_CHECKS_PER_MINUTE", 10, minimum=1)
ANEX_INPUT_RETENTION_DAYS = env.integer("ANEX_INPUT_RETENTION_DAYS", 7, minimum=1)
# What one organization may keep stored at once, inputs (uploads, ingests, OpenAI files)
# counted until their objects are deleted (jobs.services.quota; issue 40 M4): staff may
# set another quota on an organization in the admin.
ANEX_STORED_INPUTS_MAX = env.integer("ANEX_STORED_INPUTS_MAX", 10_000, minimum=1)
ANEX_STORED_INPUT_BYTES_MAX = env.integer("ANEX_STORED_INPUT_BYTES_MAX", 100 * 1024**3,
                                          minimum=1)
# Results are kept this long after a job ends (the reference: 30 days).
ANEX_RESULT_RETENTION_DAYS = env.integer("ANEX_RESULT_RETENTION_DAYS", 30, minimum=1)
# Rows per chunk: one engine call each. Larger chunks batch better on a GPU; smaller ones
# lose less to a dead worker and deliver more on cancel.
ANEX_CHUNK_ROWS = env.integer("ANEX_CHUNK_ROWS", 256, minimum=1)
# Rows that share work planned together (jobs.validation.grouping, issue 43): the estimate
# keys every JSONL row and the start runs rows of a shared prefix, and identical rows, in
# the same chunks. Off: every plan is contiguous, as before (the bench compares the two).
ANEX_GROUP_ROWS = env.boolean("ANEX_GROUP_ROWS", True)
# Fair dispatch (jobs.services.chunks.chunks_release,
# docs/dev/decisions/2026-12-01-fair-dispatch.md): the chunks of one model in one region that may be
# sent or running at once, fleet-wide, and of those at most this many of one job. Set the first to
# about the model's GPU workers times their threads plus a few: the queue then holds no more than
# those few, so a new job's first chunk is sent as the next chunk ends, however large the running
# jobs.
ANEX_DISPATCH_IN_FLIGHT = env.integer("ANEX_DISPATCH_IN_FLIGHT", 8, minimum=1)
ANEX_DISPATCH_JOB_IN_FLIGHT = env.integer("ANEX_DISPATCH_JOB_IN_FLIGHT",
                                          ANEX_DISPATCH_IN_FLIGHT, minimum=1)
# A running chunk whose heartbeat is older than this belongs to a dead worker (the reaper
# re-queues it); workers beat every few seconds.
ANEX_HEARTBEAT_STALE_SECONDS = env.integer("ANEX_HEARTBEAT_STALE_SECONDS", 180, minimum=5)
# Sampled estimates are free and run on the paid models' workers: an organization may use
# at most this many sampled tokens (prompt and generated) an hour (jobs.services.sampling).
# The default is a few worst-case samples (64 rows at a 32,768-token context) or dozens
# of typical ones.
ANEX_SAMPLE_TOKENS_PER_HOUR = env.integer("ANEX_SAMPLE_TOKENS_PER_HOUR", 8_000_000,
                                          minimum=1)

# Stripe top-ups are optional: without keys the console says top-up is unavailable.
STRIPE_SECRET_KEY = env.prefixed_secret("STRIPE_SECRET_KEY", ("sk_", "rk_"))
STRIPE_WEBHOOK_SECRET = env.prefixed_secret("STRIPE_WEBHOOK_SECRET", ("whsec_",))
# Another Stripe API origin (stripe-mock, a test server); unset means Stripe itself.
STRIPE_API_BASE = env.optional_str("STRIPE_API_BASE")
if STRIPE_API_BASE is not None:
    env.origin("STRIPE_API_BASE", STRIPE_API_BASE)

# Credits every new organization is granted (docs/dev/decisions/2026-12-01-credits-and-billing.md).
ANEX_FREE_GRANT_CENTS = env.integer("ANEX_FREE_GRANT_CENTS", 100, minimum=0)

# The SSRF-safe fetcher (anex/net.py). Loopback is for tests only; a CA bundle path lets
# tests trust their own certificate authority. Both default off.
ANEX_FETCH_ALLOW_LOOPBACK = env.boolean("ANEX_FETCH_ALLOW_LOOPBACK", False)
ANEX_FETCH_CA_BUNDLE = env.optional_str("ANEX_FETCH_CA_BUNDLE")

# The per-key request rate when a key sets none
# (docs/dev/decisions/2026-12-01-adopted-from-the-peer-api.md).
ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE = env.integer(
    "ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE", 600, minimum=1
)
# Seconds a client is told to wait on a 503 (Retry-After).
ANEX_RETRY_AFTER_SECONDS = env.integer("ANEX_RETRY_AFTER_SECONDS", 5, minimum=1)

# The ceiling over every JSON request body on /batch/, /realtime/ and /openai/ but a realtime
# embedding request's (anex/api/bodylimit.py): over it, 413 before a byte is read. It is the
# cap of a submit, a check (a response_format of at most 64 KiB, however it is spelt) and a
# realtime decision (a text of at most 50,000 characters); the small bodies have lower ones.
ANEX_API_MAX_BODY_BYTES = env.integer("ANEX_API_MAX_BODY_BYTES", 2 * 1024 * 1024,
                                      minimum=64 * 1024)

# The realtime API (realtime/, docs/realtime.md): the warm engine servers answering each
# realtime model, "model-id=http://127.0.0.1:8101;…" (`make run` starts one per local model
# and sets this), several per model as "model-id=URL,URL" (or the model named again), each
# request sent to the next in turn; a model with a realtime rate but no engine here answers
# 501. An engine on another machine is reached over https://; plain http:// only on this
# one (a loopback address), where nothing crosses a network.
ANEX_REALTIME_ENGINES = env.url_lists("ANEX_REALTIME_ENGINES")
# The secret every request to a realtime engine server is signed with (HMAC-SHA256,
# realtime/engine_client.py), shared by the web tier and its engine servers: an engine
# server refuses a request without it (`make run` makes one per run, 64 characters). At
# least 32 characters, HMAC-SHA256's own key size, whatever the mode.
ENGINE_SECRET_MIN_LENGTH = 32
ANEX_REALTIME_ENGINE_SECRET = env.optional_secret("ANEX_REALTIME_ENGINE_SECRET",
                                                  min_length=ENGINE_SECRET_MIN_LENGTH)
# Realtime requests one organization may have in flight at once (past it: 429).
ANEX_REALTIME_CONCURRENCY = env.integer("ANEX_REALTIME_CONCURRENCY", 64, minimum=1)
# Realtime requests one web process serves at once (past it: 503 with Retry-After): below
# its threads (`make run`: 16 a process), so a slow engine never holds every thread and the
# batch API, the console and /healthz keep answering.
ANEX_REALTIME_PROCESS_CONCURRENCY = env.integer("ANEX_REALTIME_PROCESS_CONCURRENCY", 12,
                                                minimum=1)
# The most realtime spend of one organization that may wait for the settlement (metered,
# not yet in the ledger, and reserved by requests in flight), in credits: past it, 503.
ANEX_REALTIME_UNSETTLED_CAP_CREDITS = env.integer("ANEX_REALTIME_UNSETTLED_CAP_CREDITS",
                                                  1000, minimum=1)
# Settled realtime usage rows are purged after this many days (their daily sums are kept).
ANEX_REALTIME_USAGE_RETENTION_DAYS = env.integer("ANEX_REALTIME_USAGE_RETENTION_DAYS", 7,
                                                 minimum=1)
# How long a realtime request waits for its engine before answering 502.
ANEX_REALTIME_TIMEOUT_SECONDS = env.integer("ANEX_REALTIME_TIMEOUT_SECONDS", 30, minimum=1)
# POST /realtime/v1/embeddings may carry 2,097,152 characters, which JSON can spell in up to
# 12 bytes each (an escaped surrogate pair): its body limit is its own, so a request over
# the character limits is answered 400 as the reference says, not 413.
ANEX_REALTIME_EMBEDDINGS_MAX_BODY_BYTES = env.integer(
    "ANEX_REALTIME_EMBEDDINGS_MAX_BODY_BYTES", 26 * 1024 * 1024, minimum=64 * 1024)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["anex.api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["anex.api.permissions.HasApiKey"],
    "DEFAULT_THROTTLE_CLASSES": ["anex.api.throttling.ApiKeyRateThrottle"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["anex.api.parsers.BoundedJSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "anex.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "anex batch API",
    "DESCRIPTION": (
        "Batch inference: upload a file of requests, approve the estimate, download the "
        "result row for row. Human-readable docs at /docs/."
    ),
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVERS": [
        {"url": ANEX_API_ORIGIN, "description": "world region"},
        {"url": ANEX_EU_API_ORIGIN, "description": "EU region (EEA data routing)"},
    ],
    "COMPONENT_SPLIT_REQUEST": True,
    # Named enums: the models' choices carry labels and the request serializers' plain
    # values, two enums that check --deploy otherwise warns collide on one name; the
    # status sets of inputs, jobs and checks are named after what they are the status of.
    "ENUM_NAME_OVERRIDES": {
        "DataResidencyEnum": "anex.regions.Region",
        "DataResidencyRequestEnum": "anex.regions.Region.values",
        "JobStatusEnum": "jobs.constants.JobStatus",
        "InputStatusEnum": "jobs.constants.InputStatus",
        "CheckStatusEnum": "jobs.constants.CheckStatus",
        "FormatEnum": "inference.constants.InputFormat",
        "FormatRequestEnum": "inference.constants.InputFormat.values",
        # The OpenAI surface's constants (openai_api.serializers): OpenAI's object names.
        "OpenAIFileObjectEnum": ["file"],
        "OpenAIListObjectEnum": ["list"],
        "OpenAIBatchEnum": ["batch"],
        "OpenAIFilePurposeEnum": ["batch", "batch_output"],
        "OpenAIBatchStatusEnum": "openai_api.serializers.BATCH_STATUSES",
    },
    # anex/api/schema.py: links from each create to what takes its id, the JsonValue
    # component, a body that cannot be empty marked required, single-use answer shapes in
    # place, each `required` in field order.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "anex.api.schema.links_place",
        "anex.api.schema.json_value_add",
        "anex.api.schema.bodies_required",
        "anex.api.schema.answers_inline",
        "anex.api.schema.required_in_field_order",
    ],
}

LOG_LEVEL = env.choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
# "json": one object a line with request_id, job_id and chunk_id, for a log pipeline
# (anex.logcontext); "plain" for a person reading `make run`.
LOG_FORMAT = env.choice("ANEX_LOG_FORMAT", "plain", ("plain", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "anex.requestid.RequestIdLogFilter"},
                "secrets": {"()": "anex.logmask.SecretsLogFilter"},
                "job": {"()": "anex.logcontext.JobLogFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"},
        "json": {"()": "anex.logcontext.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["request_id", "job", "secrets"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "INFO"}},
}

# Deployment security (`manage.py check --deploy` is clean with DEBUG off; CI runs it).
# How many reverse proxies in front of the web server append to X-Forwarded-For and set
# X-Forwarded-Proto. 0 (a direct connection) trusts neither header: a client could send
# them itself to pose as https or as another address for the sign-in rate limits.
ANEX_TRUSTED_PROXY_COUNT = env.integer("ANEX_TRUSTED_PROXY_COUNT", 0, minimum=0, maximum=10)
ALLAUTH_TRUSTED_PROXY_COUNT = ANEX_TRUSTED_PROXY_COUNT
if ANEX_TRUSTED_PROXY_COUNT:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Redirect plain http to https. Off by default so `make run` and the tests serve plain
# http; a deployment turns it on (or its proxy refuses http) and check --deploy says so.
SECURE_SSL_REDIRECT = env.boolean("ANEX_SSL_REDIRECT", False)
# Sent on https responses only, so `make run` on http://localhost is unaffected. The
# header comes from the API hosts, so includeSubDomains covers only hosts beneath them.
SECURE_HSTS_SECONDS = env.integer("ANEX_HSTS_SECONDS", 0 if DEBUG else 31_536_000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# Secure cookies are kept by browsers on http://localhost too (a secure context), so only
# DEBUG turns them off.
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG

# Worker roles (anex/roles.py, docs/deploy.md): what each role's command starts. The web
# tier: gunicorn's address, processes and threads (a realtime request mostly waits on its
# engine, so threads).
ANEX_WEB_BIND = env.string("ANEX_WEB_BIND", "127.0.0.1:8000")
if not ANEX_WEB_BIND.rpartition(":")[2].isdigit() \
        or not 1 <= int(ANEX_WEB_BIND.rpartition(":")[2]) <= 65535:
    raise ImproperlyConfigured(
        f"ANEX_WEB_BIND={ANEX_WEB_BIND!r} is not host:port (such as 0.0.0.0:8000).")
ANEX_WEB_WORKERS = env.integer("ANEX_WEB_WORKERS", 2, minimum=1, maximum=64)
ANEX_WEB_THREADS = env.integer("ANEX_WEB_THREADS", 16, minimum=1, maximum=256)
# Slow clients (issue 40 M2; docs/dev/decisions/2026-12-06-slow-clients-and-the-web-tier.md). Every
# read and write on a web connection waits at most this long (anex.gunicorn_hooks), so a client
# that stops sending or reading mid-request frees its thread: gunicorn's own threads wait
# without a bound once a request's first byte has come.
ANEX_WEB_SOCKET_TIMEOUT_SECONDS = env.integer("ANEX_WEB_SOCKET_TIMEOUT_SECONDS", 30,
                                              minimum=1, maximum=3600)
# The whole JSON body of a request to the batch, realtime or OpenAI API (at most a few MiB;
# 26 MiB for realtime embeddings) must arrive within this long (anex.api.bodylimit): a
# client trickling a byte at a time cannot hold a thread for longer.
ANEX_API_BODY_SECONDS = env.integer("ANEX_API_BODY_SECONDS", 30, minimum=1, maximum=3600)
# File transfers a web process streams itself (anex.transfers): uploads and content
# downloads at once per process (fewer than its threads), and per organization and
# direction fleet-wide. Past the first, 503; past the second, 429; both with Retry-After.
ANEX_WEB_TRANSFERS_PER_PROCESS = env.integer("ANEX_WEB_TRANSFERS_PER_PROCESS",
                                             max(1, ANEX_WEB_THREADS // 4), minimum=1)
if ANEX_WEB_TRANSFERS_PER_PROCESS >= ANEX_WEB_THREADS > 1:
    raise ImproperlyConfigured(
        f"ANEX_WEB_TRANSFERS_PER_PROCESS={ANEX_WEB_TRANSFERS_PER_PROCESS} must be below "
        f"ANEX_WEB_THREADS={ANEX_WEB_THREADS}: file transfers must leave threads for the "
        "rest of the API.")
ANEX_ORG_TRANSFERS_IN_FLIGHT = env.integer("ANEX_ORG_TRANSFERS_IN_FLIGHT", 4, minimum=1)
# A GPU worker is one process (one engine per model it serves, on the GPUs it is given):
# its threads share that engine's running batch. A CPU worker holds no engine, so it may
# run several processes; one by default, never one per core.
ANEX_GPU_WORKER_THREADS = env.integer("ANEX_GPU_WORKER_THREADS", 4, minimum=1, maximum=256)
ANEX_CPU_WORKER_PROCESSES = env.integer("ANEX_CPU_WORKER_PROCESSES", 1, minimum=1,
                                        maximum=256)
ANEX_CPU_WORKER_THREADS = env.integer("ANEX_CPU_WORKER_THREADS", 8, minimum=1, maximum=256)
# The share of each GPU's memory a worker's vLLM engine takes (weights and KV cache), and
# how many GPUs one engine spans (tensor parallelism): passed to vLLM's engine constructor
# on a GPU machine (inference/engines/runtime.py). A CPU build sizes its KV cache apart.
ANEX_GPU_MEMORY_FRACTION = env.fraction("ANEX_GPU_MEMORY_FRACTION", 0.9)
ANEX_TENSOR_PARALLEL_SIZE = env.integer("ANEX_TENSOR_PARALLEL_SIZE", 1, minimum=1,
                                        maximum=64)
# The most tokens a generate engine's KV cache holds (0: as much as the memory above gives,
# vLLM's own sizing). Rounded up to whole KV blocks (inference/engines/runtime.py); a budget
# short of the whole context of one row is refused by vLLM as the engine starts. What a
# smaller cache does to rows sharing a prompt prefix is measured by bench/run_throughput.py
# (--kv-cache-tokens), which gives the same budget to both sides.
ANEX_KV_CACHE_TOKENS = env.integer("ANEX_KV_CACHE_TOKENS", 0, minimum=0)
# Placement: the regions a worker serves are named, never assumed. A worker that names
# none serves the world region only, so EU data runs only on workers that name "eu"
# (docs/dev/decisions/2026-12-02-worker-roles-and-placement.md); `make run`'s one machine names
# both.
ANEX_WORKER_REGIONS = env.csv_list("ANEX_WORKER_REGIONS", ["world"])
if not ANEX_WORKER_REGIONS or set(ANEX_WORKER_REGIONS) - {"world", "eu"}:
    raise ImproperlyConfigured(
        f"ANEX_WORKER_REGIONS={','.join(ANEX_WORKER_REGIONS)!r} must name one or both of "
        "world and eu.")
# Behind PgBouncer in transaction pooling mode (docs/deploy.md, "PgBouncer"): a server
# connection is lent per transaction, so nothing may rely on session state. "pgbouncer"
# turns off server-side cursors and psycopg's prepared statements; the product takes no
# session-level lock and sets nothing on a session (tests/db/test_pgbouncer.py).
ANEX_DB_POOLER = env.choice("ANEX_DB_POOLER", "none", ("none", "pgbouncer"))
if ANEX_DB_POOLER == "pgbouncer":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None

# Operations (anex/metrics.py, anex/health.py). GET /metrics answers loopback callers only,
# or, with a token set, only `Authorization: Bearer <token>` (behind a proxy, set one).
ANEX_METRICS_TOKEN = env.string("ANEX_METRICS_TOKEN", "")
# A worker's metrics port (anex/workermetrics.py) listens on loopback unless told otherwise;
# on any other address its /metrics and /readyz (which names the database, the broker and
# the engines) are open to whoever reaches the machine, so the token is required there.
ANEX_WORKER_METRICS_HOST = env.string("ANEX_WORKER_METRICS_HOST", "127.0.0.1")
if not loopback_host(ANEX_WORKER_METRICS_HOST) and not ANEX_METRICS_TOKEN:
    raise ImproperlyConfigured(
        f"ANEX_WORKER_METRICS_HOST={ANEX_WORKER_METRICS_HOST!r} serves a worker's metrics "
        "and readiness beyond this machine: set ANEX_METRICS_TOKEN (scrapers send it as a "
        "bearer token), or leave the host at 127.0.0.1.")
# Outermost, so a request's latency counts every middleware and a refusal by one is counted.
MIDDLEWARE.insert(0, "anex.metrics.RequestMetricsMiddleware")

# Security round 2 (issue 22 M4, M5; docs/dev/decisions/2026-12-02-heavy-free-work.md and
# docs/dev/decisions/2026-12-02-roles-and-offboarding.md). Preflight checks one organization may
# have reading at once: each reads and tokenizes a whole input, for free.
ANEX_CHECKS_IN_FLIGHT = env.integer("ANEX_CHECKS_IN_FLIGHT", 3, minimum=1)
# Active API keys one organization may hold: each has its own request rate.
ANEX_API_KEYS_MAX = env.integer("ANEX_API_KEYS_MAX", 25, minimum=1)
# Requests a minute one organization's keys may send together, beside each key's own rate
# (ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE): more keys do not make more rate.
ANEX_ORG_RATE_LIMIT_PER_MINUTE = env.integer("ANEX_ORG_RATE_LIMIT_PER_MINUTE", 3000, minimum=1)
# POSTs one console user may make a minute (every form: keys, members, settings).
ANEX_CONSOLE_ACTIONS_PER_MINUTE = env.integer("ANEX_CONSOLE_ACTIONS_PER_MINUTE", 60, minimum=1)
# Webhook test events one organization may send a minute (the Settings page's button; each
# is a delivery with retries to the owner's endpoint; issue 22 L5).
ANEX_WEBHOOK_TESTS_PER_MINUTE = env.integer("ANEX_WEBHOOK_TESTS_PER_MINUTE", 5, minimum=1)
# Staff must have TOTP set up (allauth MFA) to open the admin (issue 22 L9).
ANEX_STAFF_MFA_REQUIRED = env.boolean("ANEX_STAFF_MFA_REQUIRED", True)
