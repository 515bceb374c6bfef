#!/usr/bin/env bash
# Make sure the binaries of a real local Kubernetes cluster exist:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok (the control
#   plane with fake nodes, tests/k8s) and kubelet, kube-proxy, coredns (the real node, e2e/cluster)
#
# Order of preference:
#   1. PREFIXROUTER_K8S_BIN=/dir   (must hold all six binaries; an error otherwise)
#   2. KUBEBUILDER_ASSETS=/dir     (envtest layout; binaries it lacks, usually
#                                   kube-controller-manager, kube-scheduler and kwok,
#                                   are built and the two are merged via symlinks)
#   3. built from the official Go modules through the module proxy, cached outside the repo in
#      ${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router/k8s/<k8s-version>/bin
#
# Progress goes to stderr. The last line on stdout is the directory holding all the binaries;
# the same path is written to ${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router/k8s/bin-dir.
#
# --check: only look (env vars, cache); never build; exit 3 when the binaries are not there.
#
# Knobs: K8S_VERSION (v1.36.3), ETCD_VERSION (v3.6.8), KWOK_VERSION (v0.8.0),
#        COREDNS_VERSION (v1.15.0), PREFIXROUTER_K8S_CACHE (cache root), GO (go binary),
#        GOPROXY, GOTOOLCHAIN.
set -euo pipefail

CHECK_ONLY=0
case "${1:-}" in
  --check) CHECK_ONLY=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE_ROOT="${PREFIXROUTER_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router/k8s}"
BIN_DIR_FILE="$CACHE_ROOT/bin-dir"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kubelet kube-proxy coredns)

log() { echo "ensure-binaries: $*" >&2; }
die() { echo "ensure-binaries: error: $*" >&2; exit 1; }

missing_in() { # dir -> names of the binaries missing from it
  local dir="$1" b
  for b in "${BINARIES[@]}"; do [ -x "$dir/$b" ] || echo "$b"; done
}

publish() { # dir
  mkdir -p "$CACHE_ROOT"
  printf '%s\n' "$1" >"$BIN_DIR_FILE.tmp" && mv "$BIN_DIR_FILE.tmp" "$BIN_DIR_FILE"
  log "binaries ready in $1"
  echo "$1"
  exit 0
}

# ---------------------------------------------------------------- 1. explicit directory
if [ -n "${PREFIXROUTER_K8S_BIN:-}" ]; then
  miss="$(missing_in "$PREFIXROUTER_K8S_BIN" | tr '\n' ' ')"
  [ -z "$miss" ] || die "PREFIXROUTER_K8S_BIN=$PREFIXROUTER_K8S_BIN lacks: $miss"
  log "using PREFIXROUTER_K8S_BIN"
  publish "$(cd "$PREFIXROUTER_K8S_BIN" && pwd)"
fi

VDIR="$CACHE_ROOT/$K8S_VERSION"
BIN="$VDIR/bin"

# ---------------------------------------------------------------- 2. KUBEBUILDER_ASSETS
ASSETS=""
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  [ -d "$KUBEBUILDER_ASSETS" ] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS is not a directory"
  ASSETS="$(cd "$KUBEBUILDER_ASSETS" && pwd)"
  miss="$(missing_in "$ASSETS" | tr '\n' ' ')"
  if [ -z "$miss" ]; then
    log "using KUBEBUILDER_ASSETS"
    publish "$ASSETS"
  fi
  log "KUBEBUILDER_ASSETS lacks: $miss- those come from the cache/build"
fi

merge_assets() { # link KUBEBUILDER_ASSETS binaries over the built ones
  local merged b
  merged="$CACHE_ROOT/merged-$(printf '%s' "$ASSETS" | cksum | cut -d' ' -f1)"
  mkdir -p "$merged"
  for b in "${BINARIES[@]}"; do
    if [ -x "$ASSETS/$b" ]; then ln -sfn "$ASSETS/$b" "$merged/$b"; else ln -sfn "$BIN/$b" "$merged/$b"; fi
  done
  publish "$merged"
}

# ---------------------------------------------------------------- 3. cache
if [ -z "$(missing_in "$BIN")" ] && grep -qx "etcd $ETCD_VERSION" "$BIN/VERSIONS" 2>/dev/null \
    && grep -qx "kwok $KWOK_VERSION" "$BIN/VERSIONS" 2>/dev/null \
    && grep -qx "coredns $COREDNS_VERSION" "$BIN/VERSIONS" 2>/dev/null; then
  log "cached: $BIN (k8s $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, coredns $COREDNS_VERSION); nothing to build"
  [ -n "$ASSETS" ] && merge_assets
  publish "$BIN"
fi

# ---------------------------------------------------------------- 4. build
if [ "$CHECK_ONLY" = 1 ]; then
  echo "ensure-binaries: error: no Kubernetes binaries for k8s $K8S_VERSION / etcd $ETCD_VERSION / kwok $KWOK_VERSION / coredns $COREDNS_VERSION in $BIN." >&2
  echo "  Build them once with 'make k8s-binaries' (bash hack/cluster/ensure-binaries.sh; needs go >= 1.26" >&2
  echo "  and the Go module proxy), or set PREFIXROUTER_K8S_BIN / KUBEBUILDER_ASSETS to a directory holding: ${BINARIES[*]}" >&2
  exit 3
fi
GO="${GO:-}"
if [ -z "$GO" ]; then
  if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
  elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
  else
    die "the Kubernetes binaries are not cached in $BIN and 'go' (>= 1.26) is not installed to build them.
  Install Go (https://go.dev/dl/), or point PREFIXROUTER_K8S_BIN (or KUBEBUILDER_ASSETS) at a directory
  holding: ${BINARIES[*]}"
  fi
fi
if ! command -v "$GO" >/dev/null 2>&1; then
  die "GO=$GO is not an executable go; install Go >= 1.26 or point PREFIXROUTER_K8S_BIN at prebuilt binaries"
fi
go_minor="$("$GO" env GOVERSION 2>/dev/null | sed -n 's/^go1\.\([0-9]*\).*/\1/p')"
if [ -n "$go_minor" ] && [ "$go_minor" -lt 26 ]; then
  die "$GO is $("$GO" env GOVERSION); k8s $K8S_VERSION needs go >= 1.26 (or set GOTOOLCHAIN=auto to let go fetch one)"
fi
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS=-mod=mod
export CGO_ENABLED=0
export GOWORK=off
log "building k8s $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION, coredns $COREDNS_VERSION with $("$GO" version) (GOPROXY=$GOPROXY)"
log "this is a one-time cold build (tens of minutes on 2 cores); later runs print 'cached'"
start=$(date +%s)

BUILD="$VDIR/build"
STAGE="$VDIR/bin.partial"
mkdir -p "$BUILD" "$STAGE"

# The k8s go.mod: its replace block lists every staging module (pinned to ./staging/... there).
log "fetching k8s.io/kubernetes@$K8S_VERSION go.mod"
kmod_json="$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION")" \
  || die "cannot download k8s.io/kubernetes@$K8S_VERSION through $GOPROXY"
kgomod="$(printf '%s' "$kmod_json" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[ -f "$kgomod" ] || die "go mod download did not report the go.mod of k8s.io/kubernetes@$K8S_VERSION"
go_line="$(grep -m1 '^go ' "$kgomod" | awk '{print $2}')"
staging="$(sed -n '/^replace[[:space:]]*(/,/^)/p' "$kgomod" \
  | awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}')"
[ -n "$staging" ] || die "no staging replace block found in $kgomod"
staging_version="v0.${K8S_VERSION#v1.}"

{
  echo "// Generated by hack/cluster/ensure-binaries.sh: builds the Kubernetes control-plane"
  echo "// binaries from k8s.io/kubernetes@$K8S_VERSION (staging modules at $staging_version)."
  echo "module prefixrouter.local/k8sbuild"
  echo
  echo "go $go_line"
  echo
  echo "require ("
  echo "	k8s.io/kubernetes $K8S_VERSION"
  echo "	go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  echo ")"
  echo
  echo "replace ("
  for m in $staging; do
    if "$GO" mod download -json "$m@$staging_version" >/dev/null 2>&1; then
      echo "	$m => $m $staging_version"
    else
      # Not published (e.g. k8s.io/sample-cli-plugin); nothing we build imports it, so a stub
      # module satisfies the module graph.
      stub="stubs/${m//\//_}"
      mkdir -p "$BUILD/$stub"
      printf 'module %s\n\ngo %s\n' "$m" "$go_line" >"$BUILD/$stub/go.mod"
      log "note: $m@$staging_version is not on the proxy; using an empty stub module"
      echo "	$m => ./$stub"
    fi
  done
  echo ")"
} >"$BUILD/go.mod"
touch "$BUILD/go.sum"

pkg=k8s.io/component-base/version
cpkg=k8s.io/client-go/pkg/version
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
commit="$(printf '%s' "$kmod_json" | sed -n 's/.*"Hash": "\([0-9a-f]*\)".*/\1/p' | head -1)"
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ldflags="-s -w"
for p in $pkg $cpkg; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$now"
  [ -n "$commit" ] && ldflags+=" -X $p.gitCommit=$commit"
done

# One invocation: the binaries share most of k8s.io/kubernetes, which is compiled once.
log "go build kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd (one invocation)"
(
  cd "$BUILD"
  "$GO" build -trimpath -ldflags="$ldflags" -o "$STAGE/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy \
    go.etcd.io/etcd/server/v3
) >&2 || die "go build of the Kubernetes binaries failed (see above); module dir: $BUILD"
# The etcd main package is go.etcd.io/etcd/server/v3: go names that binary after "server".
for n in server v3; do [ -x "$STAGE/$n" ] && mv -f "$STAGE/$n" "$STAGE/etcd"; done
[ -x "$STAGE/etcd" ] || die "etcd binary not produced by the build (contents: $(ls "$STAGE"))"

log "go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
GOBIN="$STAGE" GOFLAGS= "$GO" install -trimpath -ldflags="-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2 \
  || die "go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION failed (see above)"

# CoreDNS for the real node's cluster DNS; static, as its image has nothing else (FROM scratch).
log "go install github.com/coredns/coredns@$COREDNS_VERSION"
GOBIN="$STAGE" GOFLAGS= "$GO" install -trimpath -ldflags="-s -w" "github.com/coredns/coredns@$COREDNS_VERSION" >&2 \
  || die "go install github.com/coredns/coredns@$COREDNS_VERSION failed (see above)"

miss="$(missing_in "$STAGE" | tr '\n' ' ')"
[ -z "$miss" ] || die "build finished but these binaries are missing: $miss"
rm -rf "$BIN" && mv "$STAGE" "$BIN"
cat >"$BIN/VERSIONS" <<EOF
kubernetes $K8S_VERSION
etcd $ETCD_VERSION
kwok $KWOK_VERSION
coredns $COREDNS_VERSION
go $("$GO" env GOVERSION)
built $now in $(( $(date +%s) - start ))s
EOF
log "built in $(( $(date +%s) - start ))s (wall clock)"
[ -n "$ASSETS" ] && merge_assets
publish "$BIN"
