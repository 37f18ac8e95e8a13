#!/usr/bin/env bash
# Build the saasbench task base image without any registry: debootstrap a minimal Debian bookworm
# root file system with python3 (variant minbase: bash, coreutils, apt, python3) and `docker import` it.
#
#   infra/base-image/build.sh                # rootfs tarball (cached) + import into $DOCKER_HOST's engine
#   infra/base-image/build.sh --tar-only     # only make sure the cached tarball exists, print its path
#
# Idempotent: the tarball is built once and kept under $SAASBENCH_CACHE_DIR/base-image
# (default ~/.cache/saasbench/base-image, outside the repository); the import is skipped when the
# engine already has the tag. Needs root (debootstrap) and the Debian mirror (deb.debian.org, or $DEBIAN_MIRROR).
# Environment: IMAGE (default saasbench/debian-python:bookworm), SUITE (bookworm), DEBIAN_MIRROR,
# EXTRA_PACKAGES (comma-separated, added to --include), DOCKER_HOST (as for the docker CLI).
set -euo pipefail

IMAGE=${IMAGE:-saasbench/debian-python:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES="python3,ca-certificates${EXTRA_PACKAGES:+,$EXTRA_PACKAGES}"
CACHE=${SAASBENCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/saasbench}/base-image
# the tarball name carries the inputs, so a change of suite or packages builds a new one
KEY=$(printf '%s|%s|%s' "$SUITE" "$PACKAGES" "minbase" | sha256sum | cut -c1-12)
TAR="$CACHE/debian-$SUITE-python-$KEY.tar"

tar_only=0
[[ "${1:-}" == "--tar-only" ]] && tar_only=1

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9   # one build at a time, also across processes

if [[ ! -s "$TAR" ]]; then
    command -v debootstrap >/dev/null || { echo "debootstrap missing: apt-get install -y debootstrap" >&2; exit 1; }
    work=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    echo "debootstrap $SUITE (minbase, +$PACKAGES) from $MIRROR ..." >&2
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$work/rootfs" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    # smaller image: no apt lists, caches or docs
    rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/"*.bin "$work/rootfs/var/cache/apt/archives/"*.deb \
           "$work/rootfs/usr/share/doc" "$work/rootfs/usr/share/man" "$work/rootfs/usr/share/info"
    tar --numeric-owner -C "$work/rootfs" -cf "$work/rootfs.tar" .
    mv "$work/rootfs.tar" "$TAR"
    rm -rf "$work"
    trap - EXIT
fi

if (( tar_only )); then
    echo "$TAR"
    exit 0
fi

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "$IMAGE already present" >&2
else
    docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
                  --change 'CMD ["bash"]' "$TAR" "$IMAGE" >/dev/null
    echo "imported $IMAGE" >&2
fi
echo "$IMAGE"
