# tailguard daemon image: non-root, read-only-root friendly.
#
# Pinned by exact tag. For releases also pin the digest, which a tag cannot
# change under you:
#   ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest from `docker buildx imagetools inspect`>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- build: install the project into a self-contained venv -------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tailguard
WORKDIR /src
# Metadata first so the dependency layer is cached across source-only changes.
COPY pyproject.toml README.md ./
COPY core ./core
COPY daemon ./daemon
COPY policies ./policies
COPY detectors ./detectors
COPY actions ./actions
COPY lab ./lab
COPY evaluation ./evaluation
# pip byte-compiles everything here, so the read-only root never needs .pyc writes.
RUN /opt/tailguard/bin/pip install . \
 && /opt/tailguard/bin/tailguard --help >/dev/null

# --- runtime -----------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# Same base image as the build stage, so the venv's interpreter path stays valid.
COPY --from=build /opt/tailguard /opt/tailguard

# Numeric uid/gid: Kubernetes' runAsNonRoot can only verify a numeric USER.
RUN groupadd --system --gid 10001 tailguard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin tailguard \
 && mkdir -p /etc/tailguard/policies /var/lib/tailguard \
 && chown 10001:10001 /var/lib/tailguard

# Everything that may write goes to /tmp (emptyDir in the chart): HOME for
# libraries that cache there, Matplotlib (imported by Prophet) and cmdstanpy.
ENV PATH=/opt/tailguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    XDG_CACHE_HOME=/tmp/.cache

# The journal directory; the chart mounts an emptyDir or a PVC over it.
VOLUME ["/var/lib/tailguard"]
WORKDIR /var/lib/tailguard
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["tailguard"]
CMD ["run", "--config", "/etc/tailguard/config.yaml"]
