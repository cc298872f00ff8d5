# syntax=docker/dockerfile:1
# The dispatch image: every process of docker-compose.yml but the Kafka brokers and the object
# store (the official apache/kafka and minio/minio images) runs from it: `dispatch serve`,
# `dispatch streaming`, `dispatch worker`, `dispatch keys`, the topics init, and the Spark
# master and worker (pyspark's `spark-class`). See docs/deployment.md.
#
#   docker build -t dispatch:local .
#
# Three stages: `base` (Python, a JRE for Spark, the pinned packages), `jars` (Maven resolves
# and verifies the Spark jars; Maven never reaches the final image), `app`.

# Bookworm, pinned rather than the moving default tag: openjdk-17, the Java the project is
# tested with (scripts/bootstrap.sh installs it), is a bookworm package; newer Debian
# releases carry newer Javas.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    DEBIAN_FRONTEND=noninteractive
# The JRE's post-install step links man pages into /usr/share/man/man1, which the slim
# images leave out (some openjdk packages fail to install without the folder).
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# The dependencies first, in a layer of their own: pyspark alone is ~400 MB, and this layer
# then survives every change to the project's sources. The list comes from pyproject.toml (the
# light install and the `server` extra), every version (transitive ones too) from
# constraints.txt, as scripts/bootstrap.sh does.
COPY pyproject.toml constraints.txt ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies'] + p['optional-dependencies']['server']))" \
        > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# --- the Spark jars (Delta, the Kafka connector), by the project's own mechanism -------------
FROM base AS jars
RUN apt-get update \
    && apt-get install -y --no-install-recommends maven \
    && rm -rf /var/lib/apt/lists/*
COPY conf/ conf/
COPY stack/ stack/
COPY dispatch/ dispatch/
# `python -m dispatch.stack.jars fetch` resolves stack/maven/*/pom.xml with Maven and checks
# every file against the SHA-256 in stack/jars.lock: the image holds exactly the jars the
# tests ran with. It fetches the broker set too; only the sets a Spark driver loads (spark,
# and s3: hadoop-aws and its AWS SDK for a warehouse on object storage) are kept, the brokers
# run in containers of their own. Maven's repository is a build cache, never in the image.
ENV DISPATCH_PATHS__CACHE=/opt/dispatch/cache
RUN --mount=type=cache,target=/opt/dispatch/cache/m2 \
    python -m dispatch.stack.jars fetch \
    && rm -rf /opt/dispatch/cache/jars/broker

# --- the image ---------------------------------------------------------------------------
FROM base AS app
# Paths inside the container: the verified jars, the process's own data (Spark scratch, and
# the streaming checkpoint unless paths.checkpoints names an object store), a default Delta
# warehouse for a single-container trial (docker-compose.yml puts it on the object store:
# DISPATCH_PATHS__WAREHOUSE=s3://...) and the API keys. The API must listen on every
# interface of the container, not its loopback.
ENV DISPATCH_PATHS__CACHE=/opt/dispatch/cache \
    DISPATCH_PATHS__VAR=/data/var \
    DISPATCH_PATHS__WAREHOUSE=/data/warehouse \
    DISPATCH_AUTH__KEYS_FILE=/data/keys/api-keys.json \
    DISPATCH_AUTH__DEV_KEYS_FILE=/data/keys/dev-keys.json \
    DISPATCH_API__HOST=0.0.0.0
# A user of its own, not root. The data folders exist in the image owned by it, so a named
# volume mounted there starts with that owner (Docker copies it on first mount).
RUN useradd --system --uid 10001 --create-home --home-dir /home/dispatch dispatch \
    && mkdir -p /data/var /data/warehouse /data/keys \
    && chown -R dispatch:dispatch /data
COPY --from=jars /opt/dispatch/cache/jars/spark /opt/dispatch/cache/jars/spark
COPY --from=jars /opt/dispatch/cache/jars/s3 /opt/dispatch/cache/jars/s3
COPY . .
# Editable, so the package's root stays /app: dispatch.settings finds conf/defaults.toml and
# stack/jars.lock relative to the package (a site-packages install would not have them).
# The dependencies are already installed, with their pinned versions.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps -c constraints.txt -e . \
    && dispatch --help > /dev/null
USER dispatch
# Compose names the command of each service; alone, the image shows what it can do.
CMD ["dispatch", "--help"]
