# tailguard daemon image: Debian bookworm (slim) with Debian's own Python 3.11; non-root,
# read-only-root friendly. Build it with `make image` (scripts/build-image.sh, docs/image.md).
#
# The base is Debian's, not python:3.11-slim, so that where no registry is reachable the same
# base can be assembled locally with debootstrap from a Debian mirror (scripts/build-image.sh
# does that and passes BASE_IMAGE=localhost/tailguard-base:bookworm-slim). For releases pin the
# digest, which a tag cannot change under you:
#   ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:<digest from `skopeo inspect`>
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# --- python: the base plus Debian's python3 (3.11), shared by both stages below ------------------
FROM ${BASE_IMAGE} AS python
# Same interpreter at the same path in both stages, so the venv's bin/python link stays valid.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version'

# --- build: install the project into a self-contained venv -------------------------------------
FROM python AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/tailguard
WORKDIR /src
# Runtime dependencies first (pyproject's [project] dependencies, never the [test] extra), so
# this layer, the slow one, is cached across source-only changes. The build backend comes
# here too, so the project's own install below needs no network.
# ca_bundle: the building host's CA bundle, mounted for this step only and never stored in a
# layer, for hosts whose egress to PyPI goes through a TLS-intercepting proxy. An empty file
# (no bundle on the host) leaves pip with its own CAs.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca_bundle,target=/run/secrets/ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); print("\n".join(p["project"]["dependencies"] + p["build-system"]["requires"]))' \
        > /tmp/requirements.txt \
 && /opt/tailguard/bin/pip install -r /tmp/requirements.txt \
 && find /opt/tailguard/lib/python3.11/site-packages -type d -name tests -prune -exec rm -rf {} +
# (The libraries' own test suites, pandas' alone 46 MB, are never imported at run time.)
COPY README.md ./
COPY LICENSE ./
COPY core ./core
COPY daemon ./daemon
COPY policies ./policies
COPY detectors ./detectors
COPY actions ./actions
COPY lab ./lab
COPY evaluation ./evaluation
# pip byte-compiles everything here, so the read-only root never needs .pyc writes.
# --no-deps, --no-build-isolation: dependencies and backend are the layer above (no network
# here); pip check proves they satisfy the project.
RUN /opt/tailguard/bin/pip install --no-deps --no-build-isolation . \
 && /opt/tailguard/bin/pip check \
 && /opt/tailguard/bin/tailguard --help >/dev/null \
 && /opt/tailguard/bin/python -c 'import prophet, pandas, kubernetes_asyncio, tritonclient.http'

# --- runtime ---------------------------------------------------------------------------------------
FROM python
COPY --from=build /opt/tailguard /opt/tailguard

# Numeric uid/gid: Kubernetes' runAsNonRoot can only verify a numeric USER.
RUN groupadd --system --gid 10001 tailguard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin tailguard \
 && mkdir -p /etc/tailguard/policies /var/lib/tailguard \
 && chown 10001:10001 /var/lib/tailguard

# Everything that may write goes to /tmp (emptyDir in the chart): HOME for
# libraries that cache there, Matplotlib (imported by Prophet) and cmdstanpy.
ENV PATH=/opt/tailguard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
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
