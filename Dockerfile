# The production image: `graphene web`, `graphene worker`, `graphene beat` and
# `graphene manage ...` all run from it (see compose.yaml and deploy/kubernetes.yaml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=graphene_project.settings.prod \
    GRAPHENE_DATA_DIR=/var/lib/graphene

WORKDIR /app

# git: the git.checkout kind and the git actions run the git CLI (kinds/git/README.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first, in their own layer: it is rebuilt only when the pins change.
COPY requirements/base.txt requirements/base.txt
RUN pip install -r requirements/base.txt

# An editable install keeps the code (and templates) at /app, where settings expect it.
COPY . .
RUN pip install --no-deps -e . \
    && useradd --system --home-dir /var/lib/graphene --create-home --shell /usr/sbin/nologin graphene \
    && chown graphene:graphene /var/lib/graphene

USER graphene
EXPOSE 8000
# Health checks are per process (web, worker) in compose.yaml and deploy/kubernetes.yaml.
CMD ["graphene", "web", "--host", "0.0.0.0", "--port", "8000"]
