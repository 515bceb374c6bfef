#!/usr/bin/env bash
# Build the container images the real node runs (e2e/cluster/node.py), with no Docker daemon and
# no registry, and optionally import them into the node's containerd.
#
#   product  ghcr.io/prefixrouter/prefix-router:<version>  the repository's Dockerfile, run as is by
#            buildah; its base (python:3.11-slim, which no registry can give us here) is a local
#            stand-in: a Debian bookworm rootfs made by mmdebstrap with python3 3.11 and pip
#   redis    localhost/prefix-router/redis:bookworm        Debian's redis-server on such a rootfs
#   pause    localhost/prefix-router/pause:1               hack/image/pause.c, static, FROM scratch
#   coredns  localhost/prefix-router/coredns:<version>     the coredns binary that
#            hack/cluster/ensure-binaries.sh builds (CGO_ENABLED=0), FROM scratch
#
# Every image (and each rootfs) is cached by a hash of what goes into it: the Dockerfile, the
# files its COPY lines send (less .dockerignore), the package lists, the binaries. An image whose
# hash did not change is neither rebuilt nor re-imported. Cache: $CACHE_HOME/images (buildah's
# storage, rootfs tarballs, docker-archive tarballs); `images.tsv` there lists the current ones.
#
#   hack/image/build.sh                    build what changed; print images.tsv's path
#   hack/image/build.sh --import SOCKET    ... and import them into the containerd at SOCKET
#                                          (namespace k8s.io, the one the kubelet uses)
#   hack/image/build.sh --list             print images.tsv (name, ref, hash, archive); no build
#
# Needs root (buildah's storage, chroot), and Debian's mmdebstrap, buildah, gcc and libc6-dev
# (installed with apt-get when missing). pip inside the build reaches the package index with
# the host's CA bundle (PIP_CERT, else SSL_CERT_FILE, else Debian's), mounted over the build's.
set -euo pipefail
SCRIPT_NAME=build-images
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
. "$HERE/../lib.sh"

IMPORT_SOCKET=""
case "${1:-}" in
  --import) IMPORT_SOCKET="${2:?--import needs the containerd socket path}" ;;
  --list) cat "$CACHE_HOME/images/images.tsv" 2>/dev/null || die "no images built yet"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--import CONTAINERD_SOCKET | --list]" >&2; exit 2 ;;
esac

[ "$(id -u)" = 0 ] || die "building images needs root (buildah storage and chroot); run as root"
need_debs mmdebstrap buildah gcc libc6-dev

SUITE="${IMAGE_SUITE:-bookworm}"
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# What the stand-in for python:3.11-slim holds: Python 3.11 and pip like the official image,
# passwd for the Dockerfile's useradd, tini for its ENTRYPOINT, and CA certificates.
PYTHON_DEBS="python3,python3-pip,passwd,ca-certificates,tini"
REDIS_DEBS="redis-server,redis-tools"
HOST_CA="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
[ -f "$HOST_CA" ] || die "no CA bundle at $HOST_CA for pip inside the build (set PIP_CERT)"

DIR="$CACHE_HOME/images"
mkdir -p "$DIR/rootfs" "$DIR/archives"
exec 9>"$DIR/.lock"
flock -w 1800 9 || die "another build holds $DIR/.lock"
B=(buildah --root "$DIR/storage" --runroot "$DIR/runroot" --storage-driver overlay)
TIMINGS="$DIR/timings.log"
TSV="$DIR/images.tsv"
: >"$TSV.partial"

hash_of() { # words and files -> 16 hex digits
  # Small files by content; the big ones (rootfs tarballs, the coredns binary: hundreds of MB,
  # seconds to read) by path, size, mtime and inode, which change whenever they are rewritten.
  local a
  for a in "$@"; do
    if [ -f "$a" ] && [ "$(stat -c %s "$a")" -gt 1048576 ]; then stat -c 'file %n %s %Y %i' "$a"
    elif [ -f "$a" ]; then printf 'file %s ' "$(basename "$a")"; sha256sum <"$a"
    else printf '%s\n' "$a"; fi
  done | sha256sum | cut -c1-16
}

record() { # step seconds outcome
  printf '%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" "$2" "$3" >>"$TIMINGS"
  log "$1: $3 in $2 s"
}

have_image() { "${B[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# rootfs NAME DEBS -> path of a cached tarball of a minbase rootfs with DEBS
rootfs() {
  local name="$1" debs="$2" h out t0
  h="$(hash_of "$SUITE" "$debs" "${MIRRORS[@]}" rootfs-v1)"
  out="$DIR/rootfs/$name-$h.tar"
  if [ ! -s "$out" ]; then
    t0=$(date +%s)
    log "mmdebstrap $SUITE minbase + $debs (about a minute)"
    # Documentation, manuals and translations are of no use in an image.
    mmdebstrap --quiet --variant=minbase --format=tar --include="$debs" \
      --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' \
      "$SUITE" "$out.partial" "${MIRRORS[@]}" >&2 || die "mmdebstrap of $name failed (see above)"
    mv "$out.partial" "$out"
    find "$DIR/rootfs" -name "$name-*.tar" ! -name "$(basename "$out")" -delete
    record "rootfs-$name" "$(elapsed "$t0")" built
  fi
  echo "$out"
}

# from_rootfs TAR -> a working container holding the rootfs
from_rootfs() {
  local c
  c="$("${B[@]}" from --pull-never scratch)"
  "${B[@]}" add --quiet "$c" "$1" / >/dev/null
  echo "$c"
}

# publish NAME REF HASH: export REF to a docker-archive (once per hash) and list it
publish() {
  local name="$1" ref="$2" h="$3" archive="$DIR/archives/$1-$3.tar"
  if [ ! -s "$archive" ]; then
    rm -f "$archive.partial"
    "${B[@]}" push --quiet "$ref" "docker-archive:$archive.partial:$ref" >&2
    mv "$archive.partial" "$archive"
    find "$DIR/archives" -name "$name-*.tar" ! -name "$(basename "$archive")" -delete
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$ref" "$h" "$archive" >>"$TSV.partial"
}

# ------------------------------------------------------------------------------ pause
t0=$(date +%s)
REF=localhost/prefix-router/pause:1
H="$(hash_of "$HERE/pause.c" "$(gcc -dumpfullversion)" pause-v1)"
if [ -s "$DIR/archives/pause-$H.tar" ] && have_image "$REF"; then
  record pause "$(elapsed "$t0")" cached
else
  work="$(mktemp -d)"
  gcc -static -Os -s -Wall -Werror -o "$work/pause" "$HERE/pause.c" || die "gcc -static pause.c failed"
  c="$("${B[@]}" from --pull-never scratch)"
  "${B[@]}" copy --quiet "$c" "$work/pause" /pause
  "${B[@]}" config --entrypoint '["/pause"]' --cmd '' --user 65535:65535 \
    --label io.prefixrouter.content-hash="$H" "$c"
  "${B[@]}" commit --quiet --rm "$c" "$REF" >/dev/null
  rm -rf "$work"
  rm -f "$DIR/archives/pause-$H.tar"
  record pause "$(elapsed "$t0")" built
fi
publish pause "$REF" "$H"

# ------------------------------------------------------------------------------ coredns
t0=$(date +%s)
BIN_DIR="$(bash "$REPO/hack/cluster/ensure-binaries.sh" --check 2>/dev/null | tail -1)" \
  || die "no Kubernetes binaries (CoreDNS among them): run 'make k8s-binaries' first"
[ -x "$BIN_DIR/coredns" ] || die "$BIN_DIR has no coredns: run 'make k8s-binaries'"
CDNS_VERSION="$(sed -n 's/^coredns //p' "$BIN_DIR/VERSIONS" 2>/dev/null | head -1)"
REF="localhost/prefix-router/coredns:${CDNS_VERSION:-dev}"
H="$(hash_of "$BIN_DIR/coredns" coredns-v1)"
if [ -s "$DIR/archives/coredns-$H.tar" ] && have_image "$REF"; then
  record coredns "$(elapsed "$t0")" cached
else
  c="$("${B[@]}" from --pull-never scratch)"
  "${B[@]}" copy --quiet "$c" "$BIN_DIR/coredns" /coredns
  # Non-root: the Corefile (e2e/cluster/node.py) listens on 1053, the kube-dns Service maps 53.
  "${B[@]}" config --entrypoint '["/coredns"]' --cmd '' --user 65532:65532 \
    --label io.prefixrouter.content-hash="$H" "$c"
  "${B[@]}" commit --quiet --rm "$c" "$REF" >/dev/null
  rm -f "$DIR/archives/coredns-$H.tar"
  record coredns "$(elapsed "$t0")" built
fi
publish coredns "$REF" "$H"

# ------------------------------------------------------------------------------ redis
t0=$(date +%s)
REF=localhost/prefix-router/redis:$SUITE
RFS="$(rootfs redis "$REDIS_DEBS")"
H="$(hash_of "$RFS" redis-v1)"
if [ -s "$DIR/archives/redis-$H.tar" ] && have_image "$REF"; then
  record redis "$(elapsed "$t0")" cached
else
  c="$(from_rootfs "$RFS")"
  uid="$("${B[@]}" run --isolation chroot "$c" -- id -u redis)"
  gid="$("${B[@]}" run --isolation chroot "$c" -- id -g redis)"
  # The official image turns protected mode off too (it has no config file and no password
  # by default); the operator's Deployment adds its own flags after these.
  "${B[@]}" config --entrypoint '["redis-server", "--protected-mode", "no"]' --cmd '' \
    --user "$uid:$gid" --workingdir /var/lib/redis --port 6379 \
    --label io.prefixrouter.content-hash="$H" "$c"
  "${B[@]}" commit --quiet --rm "$c" "$REF" >/dev/null
  rm -f "$DIR/archives/redis-$H.tar"
  record redis "$(elapsed "$t0")" built
fi
publish redis "$REF" "$H"

# ------------------------------------------------------------------------------ product
t0=$(date +%s)
PYFS="$(rootfs python "$PYTHON_DEBS")"
BASE_H="$(hash_of "$PYFS" python-base-v1)"
BASE_REF="localhost/prefix-router/python-base:$BASE_H"
if ! have_image "$BASE_REF"; then
  c="$(from_rootfs "$PYFS")"
  # Like the official python image: `python` and `pip` commands, and pip may install into the
  # system interpreter (Debian marks it externally managed; the image is the environment).
  "${B[@]}" run --isolation chroot "$c" -- sh -c \
    'rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && ln -sf python3 /usr/bin/python && ln -sf pip3 /usr/bin/pip'
  "${B[@]}" config --env LANG=C.UTF-8 --cmd python3 "$c"
  "${B[@]}" commit --quiet --rm "$c" "$BASE_REF" >/dev/null
fi
# Every base the Dockerfile names (FROM lines that are not earlier stages) is this stand-in.
mapfile -t BASES < <(awk 'toupper($1) == "FROM" {
    ref = ""; for (i = 2; i <= NF; i++) if ($i !~ /^--/) { ref = $i; break }
    for (i = 1; i <= NF; i++) if (toupper($i) == "AS") stages[$(i+1)] = 1
    if (ref != "" && !(ref in stages)) print ref }' "$REPO/Dockerfile" | sort -u)
for base in "${BASES[@]}"; do "${B[@]}" tag "$BASE_REF" "$base"; done

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/pyproject.toml" | head -1)"
REF="ghcr.io/prefixrouter/prefix-router:$VERSION"
# The build context as buildah sends it: the files the COPY lines name, less .dockerignore.
CONTEXT_H="$(python3 "$HERE/context_hash.py" "$REPO")"
H="$(hash_of "$BASE_H" "$CONTEXT_H" product-v1)"
if [ -s "$DIR/archives/product-$H.tar" ] && have_image "$REF"; then
  record product "$(elapsed "$t0")" cached
else
  log "buildah bud $REPO/Dockerfile -> $REF (pip downloads the dependencies' wheels)"
  "${B[@]}" bud --quiet --pull-never --isolation chroot --network host --layers=false \
    --volume "$HOST_CA:/etc/ssl/certs/ca-certificates.crt:ro" \
    --label io.prefixrouter.content-hash="$H" \
    -t "$REF" -f "$REPO/Dockerfile" "$REPO" >&2 || die "buildah bud of the Dockerfile failed (see above)"
  rm -f "$DIR/archives/product-$H.tar"
  record product "$(elapsed "$t0")" built
fi
publish product "$REF" "$H"
# Superseded builds of the product leave untagged images behind.
"${B[@]}" rmi --prune >/dev/null 2>&1 || true
mv "$TSV.partial" "$TSV"

# ------------------------------------------------------------------------------ import
if [ -n "$IMPORT_SOCKET" ]; then
  [ -S "$IMPORT_SOCKET" ] || die "no containerd socket at $IMPORT_SOCKET (is the node up? make cluster)"
  CTR=(ctr --address "$IMPORT_SOCKET" --namespace k8s.io)
  while IFS=$'\t' read -r name ref h archive; do
    t0=$(date +%s)
    have="$("${CTR[@]}" images ls "name==$ref" 2>/dev/null | awk 'NR > 1' | grep -o 'io.prefixrouter.content-hash=[0-9a-f]*' || true)"
    if [ "$have" = "io.prefixrouter.content-hash=$h" ]; then
      record "import-$name" "$(elapsed "$t0")" cached
      continue
    fi
    "${CTR[@]}" images import "$archive" >/dev/null || die "ctr images import $archive failed"
    "${CTR[@]}" images label "$ref" "io.prefixrouter.content-hash=$h" >/dev/null
    record "import-$name" "$(elapsed "$t0")" imported
  done <"$TSV"
fi
echo "$TSV"
