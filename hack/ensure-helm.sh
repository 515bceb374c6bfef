#!/usr/bin/env bash
# Make sure a helm v3 binary exists for the chart tests and print its path (last line of stdout).
#
# Order of preference:
#   1. HELM=/path/to/helm          (must run and report a v3 version; an error otherwise)
#   2. the cache: ${PREFIXROUTER_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router/helm}/<version>/helm
#   3. built once with `go install helm.sh/helm/v3/cmd/helm@<version>` through the Go module
#      proxy (GOPATH and the module cache live under the cache directory, not in ~/go).
#
# --check: only look (HELM, cache); never build; exit 3 when there is no helm.
#
# Knobs: HELM_VERSION (v3.21.4: the module proxy here serves v3.22.0 but marks it as not
#        approved), GO (go binary), GOPROXY, GOTOOLCHAIN.
# A helm already on PATH is not used: the tests pin one version so that lint rules and
# template functions do not drift from machine to machine.
set -euo pipefail

CHECK_ONLY=0
case "${1:-}" in
  --check) CHECK_ONLY=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
CACHE_ROOT="${PREFIXROUTER_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefix-router/helm}"
DEST="$CACHE_ROOT/$HELM_VERSION"
BIN="$DEST/helm"

log() { echo "ensure-helm: $*" >&2; }
die() { echo "ensure-helm: error: $*" >&2; exit 1; }

is_helm_v3() { # path -> 0 when it runs and says v3.x
  local out
  out="$("$1" version --short 2>/dev/null)" || return 1
  case "$out" in v3.*) return 0 ;; *) return 1 ;; esac
}

# ---------------------------------------------------------------- 1. explicit binary
if [ -n "${HELM:-}" ]; then
  [ -x "$HELM" ] || die "HELM=$HELM is not an executable file"
  is_helm_v3 "$HELM" || die "HELM=$HELM does not report a v3 version ($("$HELM" version --short 2>&1 || true))"
  log "using HELM=$HELM ($("$HELM" version --short))"
  echo "$HELM"
  exit 0
fi

# ---------------------------------------------------------------- 2. cache
if [ -x "$BIN" ] && [ -f "$DEST/VERSIONS" ] && is_helm_v3 "$BIN" \
    && [ "$("$BIN" version --short 2>/dev/null | cut -d+ -f1)" = "$HELM_VERSION" ]; then
  log "cached: $BIN ($HELM_VERSION); nothing to build"
  echo "$BIN"
  exit 0
fi

# ---------------------------------------------------------------- 3. build
if [ "$CHECK_ONLY" = 1 ]; then
  echo "ensure-helm: error: no helm $HELM_VERSION in $DEST." >&2
  echo "  Build it once with 'make helm' (bash hack/ensure-helm.sh; needs go and the Go module proxy)," >&2
  echo "  or set HELM=/path/to/helm (a v3 release)." >&2
  exit 3
fi
GO="${GO:-}"
if [ -z "$GO" ]; then
  if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
  elif [ -x /usr/local/go/bin/go ]; then GO=/usr/local/go/bin/go
  else
    die "helm $HELM_VERSION is not cached in $DEST and 'go' is not installed to build it.
  Install Go (https://go.dev/dl/; helm $HELM_VERSION needs the go version its go.mod names),
  or download a helm v3 release (https://github.com/helm/helm/releases) and set HELM=/path/to/helm"
  fi
fi
command -v "$GO" >/dev/null 2>&1 || die "GO=$GO is not an executable go; install Go or set HELM=/path/to/helm"

export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export GOFLAGS=-mod=mod
export CGO_ENABLED=0
export GOWORK=off
export GOPATH="$CACHE_ROOT/gopath"
export GOMODCACHE="$GOPATH/pkg/mod"
export GOBIN="$DEST/bin.partial"
mkdir -p "$GOBIN"
log "building helm $HELM_VERSION with $("$GO" version) (GOPROXY=$GOPROXY); a one-time build of a few minutes"
start=$(date +%s)
# helm's own Makefile stamps two things that a plain go install leaves at their defaults: the
# version `helm version` prints, and the Kubernetes version that `helm template` and
# `helm lint` assume without a cluster (.Capabilities.KubeVersion; v1.20 otherwise, which
# fails charts with a kubeVersion constraint). The latter is the k8s.io/client-go minor that
# helm's go.mod requires, as in helm's release builds.
mod_json="$("$GO" mod download -json "helm.sh/helm/v3@$HELM_VERSION")" \
  || die "cannot download helm.sh/helm/v3@$HELM_VERSION through $GOPROXY"
gomod="$(printf '%s' "$mod_json" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[ -f "$gomod" ] || die "go mod download did not report the go.mod of helm.sh/helm/v3@$HELM_VERSION"
k8s_minor="$(awk '$1 == "k8s.io/client-go" {print $2}' "$gomod" | sed -n 's/^v0\.\([0-9]*\)\..*/\1/p' | head -1)"
[ -n "$k8s_minor" ] || die "no k8s.io/client-go requirement found in $gomod"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"
ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
"$GO" install -trimpath -ldflags="$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2 \
  || die "go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION failed (see above).
  With an older go, try GOTOOLCHAIN=auto (lets go fetch the toolchain helm's go.mod names),
  or set HELM=/path/to/helm"
[ -x "$GOBIN/helm" ] || die "the build finished but produced no $GOBIN/helm"
is_helm_v3 "$GOBIN/helm" || die "the built $GOBIN/helm does not run: $("$GOBIN/helm" version --short 2>&1 || true)"
mv -f "$GOBIN/helm" "$BIN"
cat >"$DEST/VERSIONS" <<EOF
helm $HELM_VERSION
default kubeVersion v1.$k8s_minor (k8s.io/client-go in helm's go.mod)
go $("$GO" env GOVERSION)
EOF
rmdir "$GOBIN" 2>/dev/null || true
# Module sources are only needed to build; the module cache is read-only files, hence chmod.
chmod -R u+w "$GOPATH" 2>/dev/null && rm -rf "$GOPATH"
log "built $BIN ($("$BIN" version --short)) in $(( $(date +%s) - start ))s"
echo "$BIN"
