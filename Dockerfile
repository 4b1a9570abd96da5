# eventop: one image for the router (default) and the watcher.
#   docker build -t ghcr.io/eventop/eventop:0.1.0 .
#   docker run -p 8080:8080 ghcr.io/eventop/eventop:0.1.0            # python -m eventop.router
#   docker run ghcr.io/eventop/eventop:0.1.0 eventop.watcher run --sink URL   # python -m eventop.watcher run
#
# The base is pinned to an exact Python patch release and Debian release. For reproducible
# builds also pin its digest: PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- builder: a virtualenv with exactly the pinned runtime dependencies -------------------
FROM ${PYTHON_IMAGE} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /build
COPY requirements.txt .
# Only the runtime section of requirements.txt goes into the image (the test tools stay out).
# Every line is pinned, transitive dependencies included, so --no-deps installs exactly that
# set; wheels only, so no compiler is needed; `pip check` proves the set is consistent.
RUN sed -n '1,/^# --- test and development/p' requirements.txt \
        | grep -E '^[A-Za-z0-9_.-]+==[^ ]+$' > runtime-requirements.txt \
    && python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-deps --only-binary=:all: \
        -r runtime-requirements.txt \
    && /opt/venv/bin/pip check
# eventop itself, as the wheel `pip install eventop` gives (pyproject.toml maps the rooms of the
# repository to eventop.<room>), without the local API server and the test kit, which only
# tests and the demo use.
COPY pyproject.toml ./
COPY eventop/ eventop/
COPY engine/ engine/
COPY kube/ kube/
COPY handlers/ handlers/
COPY router/ router/
COPY watcher/ watcher/
COPY localkube/ localkube/
COPY testing/ testing/
RUN /opt/venv/bin/pip install --no-deps . \
    && rm -r /opt/venv/lib/python3.*/site-packages/eventop/localkube \
        /opt/venv/lib/python3.*/site-packages/eventop/testing \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

# --- runtime: the venv (dependencies and eventop), a non-root user ------------------------
FROM ${PYTHON_IMAGE}
# No PROMETHEUS_MULTIPROC_DIR here: it would put the watcher's prometheus_client in
# multiprocess mode too, writing to a directory nobody creates (it fails at import). The
# router makes its own under /tmp when unset; the manifests name one for it.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PORT=8080
RUN groupadd --system --gid 10001 eventop \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin eventop
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
# Compile once at build time: at run time the root filesystem is read-only.
RUN python -m compileall -q /opt/venv/lib
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["python", "-m"]
CMD ["eventop.router", "--host", "0.0.0.0"]
