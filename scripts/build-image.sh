#!/usr/bin/env bash
# Build the tailguard image from ./Dockerfile with whichever OCI builder this machine has
# (docker with a running engine, else podman, else buildah), tagged as the Helm chart's default
# image: <values.yaml image.repository>:<Chart.yaml appVersion>.
#
# The base is Debian bookworm slim. When it is neither present nor pullable (no registry
# reachable), it is assembled once from a Debian mirror with debootstrap and imported as
# $LOCAL_BASE; later builds reuse that image. docs/image.md has the details and the costs.
#
# Environment (all optional):
#   TAILGUARD_IMAGE_BUILDER  docker | podman | buildah (default: the first that works)
#   IMAGE                    the tag to build (default: the chart's default image)
#   BASE_IMAGE               the registry base (default: docker.io/library/debian:bookworm-slim)
#   LOCAL_BASE               the debootstrapped base (default: localhost/tailguard-base:bookworm-slim)
#   REBUILD_BASE=1           assemble the local base again even when it exists
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   default: the ones apt on this machine uses
#   PULL_TIMEOUT_SECONDS     how long a base pull may take before it counts as unreachable (120)
#
# Exit status: 0 built; 3 no builder can run here (the message says what to install); 1 otherwise.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

say() { printf 'build-image: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

chart_value() {  # chart_value FILE KEY: a top-level or once-indented scalar, quotes stripped
    sed -n "s/^ *$2: *\"\{0,1\}\([^\"#]*[^\"# ]\)\"\{0,1\} *\(#.*\)\{0,1\}$/\1/p" "$1" | head -n 1
}
app_version="$(chart_value helm/tailguard/Chart.yaml appVersion)"
repository="$(chart_value helm/tailguard/values.yaml repository)"
[ -n "$app_version" ] && [ -n "$repository" ] || die "cannot read the chart's image repository and appVersion"
IMAGE="${IMAGE:-$repository:$app_version}"
BASE_IMAGE="${BASE_IMAGE:-docker.io/library/debian:bookworm-slim}"
LOCAL_BASE="${LOCAL_BASE:-localhost/tailguard-base:bookworm-slim}"
PULL_TIMEOUT_SECONDS="${PULL_TIMEOUT_SECONDS:-120}"
SUITE=bookworm

# --- the builder -------------------------------------------------------------------------------------

pick_builder() {
    if [ -n "${TAILGUARD_IMAGE_BUILDER:-}" ]; then
        command -v "$TAILGUARD_IMAGE_BUILDER" >/dev/null || {
            say "TAILGUARD_IMAGE_BUILDER=$TAILGUARD_IMAGE_BUILDER is not installed"; exit 3; }
        echo "$TAILGUARD_IMAGE_BUILDER"; return
    fi
    # A docker client without a reachable engine cannot build: ask the engine, not the PATH.
    if command -v docker >/dev/null && timeout 20 docker info >/dev/null 2>&1; then echo docker; return; fi
    if command -v podman >/dev/null; then echo podman; return; fi
    if command -v buildah >/dev/null; then echo buildah; return; fi
    say "no OCI builder can run here: no docker engine, no podman, no buildah."
    say "On Debian: apt-get install podman buildah runc debootstrap (make system-deps does)."
    exit 3
}
builder="$(pick_builder)"
say "builder: $builder; image: $IMAGE"

if [ "$builder" != docker ] && [ -z "${CONTAINERS_CONF:-}" ]; then
    # Default ulimits off: raising RLIMIT_NOFILE inside the build container fails (EPERM) on
    # hosts whose limits are already capped, such as the CI machines (docs/image.md).
    conf="${TMPDIR:-/tmp}/tailguard-containers.conf"
    printf '[containers]\ndefault_ulimits = []\n' >"$conf"
    export CONTAINERS_CONF="$conf"
fi

image_exists() {
    case "$builder" in
        docker) docker image inspect "$1" >/dev/null 2>&1 ;;
        podman) podman image exists "$1" ;;
        buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
    esac
}

pull() {
    timeout "$PULL_TIMEOUT_SECONDS" "$builder" pull "$1" >&2
}

# --- the base --------------------------------------------------------------------------------------

apt_mirror() {  # apt_mirror SUITE FALLBACK: the URI apt on this machine uses for SUITE/main
    local uri=""
    if command -v apt-cache >/dev/null; then
        uri="$(apt-cache policy 2>/dev/null | awk -v s="$1/main" '$3 == s { print $2; exit }')"
    fi
    echo "${uri:-$2}"
}

assemble_base() {
    command -v debootstrap >/dev/null || {
        say "the base $BASE_IMAGE is not pullable and debootstrap is not installed to assemble it"
        say "(apt-get install debootstrap; make system-deps does)"; exit 3; }
    [ "$(id -u)" = 0 ] || die "debootstrap needs root to assemble the base"
    local mirror security rootfs started
    mirror="${DEBIAN_MIRROR:-$(apt_mirror "$SUITE" http://deb.debian.org/debian)}"
    security="${DEBIAN_SECURITY_MIRROR:-$(apt_mirror "$SUITE-security" http://deb.debian.org/debian-security)}"
    rootfs="$(mktemp -d "${TMPDIR:-/var/tmp}/tailguard-rootfs.XXXXXX")"
    # --one-file-system: never follow a /proc that a failed debootstrap left mounted inside.
    trap 'rm -rf --one-file-system "$rootfs" "$rootfs.tar" "$rootfs.log"' EXIT
    started=$SECONDS
    say "assembling the base: debootstrap --variant=minbase $SUITE from $mirror"
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
        tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; die "debootstrap failed"; }
    rm -f "$rootfs.log"
    slim_rootfs "$rootfs" "$mirror" "$security"
    say "importing the base as $LOCAL_BASE"
    local path=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    case "$builder" in
        docker|podman)
            tar -C "$rootfs" --numeric-owner -c . \
                | "$builder" import --change "ENV $path" --change 'CMD ["bash"]' - "$LOCAL_BASE" >/dev/null ;;
        buildah)
            local ctr
            ctr="$(buildah from scratch)"
            tar -C "$rootfs" --numeric-owner -cf "$rootfs.tar" .
            buildah add "$ctr" "$rootfs.tar" / >/dev/null  # a local tar archive is extracted
            rm -f "$rootfs.tar"
            buildah config --env "$path" --cmd bash "$ctr"
            buildah commit --rm "$ctr" "$LOCAL_BASE" >/dev/null ;;
    esac
    rm -rf --one-file-system "$rootfs"
    trap - EXIT
    say "base assembled in $((SECONDS - started)) s"
}

slim_rootfs() {  # what the official debian:*-slim images do on top of a minbase debootstrap
    local root="$1" mirror="$2" security="$3"
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# Documentation, manuals and translations are not installed in this image.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    printf 'Acquire::Languages "none";\n' >"$root/etc/apt/apt.conf.d/docker-no-languages"
    printf 'Apt::AutoRemove::SuggestsImportant "false";\n' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
    # Package scripts must not start services inside an image build.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$root"/usr/share/{man,groff,info,lintian,linda,locale}/* \
        "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
        "$root"/var/log/* "$root"/tmp/* "$root"/root/.cache
    # A machine-id from the assembling host has no place in an image.
    : >"$root/etc/machine-id"
}

base=""
if [ "${REBUILD_BASE:-0}" != 1 ]; then
    if image_exists "$BASE_IMAGE"; then base="$BASE_IMAGE"
    elif image_exists "$LOCAL_BASE"; then base="$LOCAL_BASE"; say "base: $LOCAL_BASE (assembled earlier)"
    elif say "pulling $BASE_IMAGE" && pull "$BASE_IMAGE"; then base="$BASE_IMAGE"
    fi
fi
if [ -z "$base" ]; then
    if [ "${REBUILD_BASE:-0}" = 1 ]; then say "REBUILD_BASE=1: assembling the base locally"
    else say "$BASE_IMAGE is not reachable: assembling the same base locally"; fi
    assemble_base
    base="$LOCAL_BASE"
fi

# --- the image ----------------------------------------------------------------------------------

# The CA bundle pip on this host trusts, handed to the build as a secret (never stored in a
# layer): egress through a TLS-intercepting proxy then works inside the build as it does here.
ca_bundle="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
if [ ! -s "$ca_bundle" ]; then
    ca_bundle="$(mktemp)"  # empty: pip keeps its own CAs
    trap 'rm -f "$ca_bundle"' EXIT
fi

# Host network: pip reaches PyPI and apt its mirror the way this machine does (no bridge needed).
args=(--network=host --secret "id=ca_bundle,src=$ca_bundle" --build-arg "BASE_IMAGE=$base"
      -t "$IMAGE" -f Dockerfile .)
started=$SECONDS
case "$builder" in
    docker) docker build "${args[@]}" ;;
    podman)
        runtime=()
        # runc, not crun: crun cannot set up containers on cgroup-v1 hybrid hosts (docs/image.md).
        [ -x /usr/sbin/runc ] && runtime=(--runtime /usr/sbin/runc)  # a global flag
        podman "${runtime[@]}" build --layers "${args[@]}" ;;
    buildah) buildah build --layers "${args[@]}" ;;
esac
say "built $IMAGE from $base in $((SECONDS - started)) s"
