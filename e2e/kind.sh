#!/usr/bin/env bash
# The tests/k8s suite against a kind cluster, for hosts with Docker (see e2e/README.md).
#
#   e2e/kind.sh                 # create (or reuse) the cluster, build, load, install, test
#   e2e/kind.sh -k chart -x     # anything after the options goes to pytest
#
# Steps: kind cluster (created if missing) -> docker build of the repository's Dockerfile ->
# kind load -> kwok on this host for fake GPU nodes -> helm upgrade --install of the chart with
# that image -> checks of the release in the cluster (operator and adapter Deployments
# Available, the APIService Available and serving our metrics, a PrefixRoutedModel reconciled
# by the in-cluster operator onto kwok GPU nodes) -> pytest tests/k8s with
# PREFIXROUTER_USE_EXISTING_CLUSTER=1 and KUBECONFIG of the kind cluster.
#
# Knobs (environment):
#   KIND_CLUSTER_NAME   cluster name (prefix-router-e2e)
#   KIND_NODE_IMAGE     kind node image (kind's default); 1.35-1.37 keeps kubectl skew fine
#   E2E_IMAGE           image to build and load (prefix-router:e2e)
#   E2E_SKIP_BUILD=1    reuse an image already loaded into the cluster
#   E2E_DELETE_CLUSTER=1  delete the cluster at the end (default: keep it for the next run)
#   E2E_WORK            scratch directory: kubeconfig, values, kwok log (e2e/.work)
#   KWOK                path of a kwok binary (else PATH, the control-plane binaries' cache,
#                       or `go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION`)
#   PYTHON              interpreter with the project installed (.venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER="${KIND_CLUSTER_NAME:-prefix-router-e2e}"
IMAGE="${E2E_IMAGE:-prefix-router:e2e}"
WORK="${E2E_WORK:-$ROOT/e2e/.work}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
RELEASE=prefix-router
RELEASE_NS=prefix-router-system
# The in-cluster operator watches only this namespace: the tests start their own operator
# processes in namespaces of their own, and two operators must never reconcile one model.
WATCH_NS=prefix-router-e2e
APISERVICE=v1beta1.external.metrics.k8s.io

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'e2e/kind.sh: error: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------------ prerequisites
command -v docker >/dev/null 2>&1 || die "docker is not installed: kind runs its nodes as \
Docker containers, so this script needs a host with Docker (on a host without it, run the same \
suite against the local control plane: make test, see docs/controlplane.md)"
docker info >/dev/null 2>&1 || die "docker is installed but its daemon does not answer \
(docker info failed): start Docker, or add this user to the docker group"
command -v kind >/dev/null 2>&1 || die "kind is not installed: see \
https://kind.sigs.k8s.io/docs/user/quick-start/#installation (or go install sigs.k8s.io/kind@latest)"
[ -x "$PYTHON" ] || die "no Python at $PYTHON: create the venv first (make test or make demo creates it), or set PYTHON"

mkdir -p "$WORK"
# kubectl: PATH, else the one built with the control-plane binaries (v1.36.3).
if ! command -v kubectl >/dev/null 2>&1; then
  if bin_dir="$(bash "$ROOT/hack/cluster/ensure-binaries.sh" --check 2>/dev/null | tail -n 1)" \
      && [ -x "$bin_dir/kubectl" ]; then
    export PATH="$bin_dir:$PATH"
  else
    die "kubectl is not on PATH (nor in the control-plane binaries' cache)"
  fi
fi
HELM="$(bash "$ROOT/hack/ensure-helm.sh" | tail -n 1)" || die "no helm (hack/ensure-helm.sh failed)"

find_kwok() {
  if [ -n "${KWOK:-}" ]; then echo "$KWOK"; return; fi
  if command -v kwok >/dev/null 2>&1; then command -v kwok; return; fi
  local dir
  if dir="$(bash "$ROOT/hack/cluster/ensure-binaries.sh" --check 2>/dev/null | tail -n 1)" \
      && [ -x "$dir/kwok" ]; then
    echo "$dir/kwok"; return
  fi
  command -v go >/dev/null 2>&1 || die "no kwok binary: set KWOK, put kwok on PATH, or install Go"
  GOBIN="$WORK/bin" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  echo "$WORK/bin/kwok"
}

# ------------------------------------------------------------------------ cluster
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  say "kind cluster $CLUSTER exists: reusing it"
else
  say "creating kind cluster $CLUSTER"
  # The HPA controller syncs every 5 s, as on the local control plane (the default is 15 s,
  # which the HPA tests' timeouts do not allow for). The patch carries no apiVersion, so kind
  # applies it to whichever kubeadm config version it generates for the node image.
  cat >"$WORK/kind-config.yaml" <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
  - |
    kind: ClusterConfiguration
    controllerManager:
      extraArgs:
        horizontal-pod-autoscaler-sync-period: "5s"
EOF
  kind create cluster --name "$CLUSTER" --config "$WORK/kind-config.yaml" --wait 180s \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
fi
export KUBECONFIG="$WORK/kubeconfig"
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"
kubectl version

# ------------------------------------------------------------------------ image
if [ "${E2E_SKIP_BUILD:-0}" != 1 ]; then
  say "building $IMAGE from $ROOT/Dockerfile"
  docker build -t "$IMAGE" "$ROOT"
  say "loading $IMAGE into $CLUSTER"
  kind load docker-image "$IMAGE" --name "$CLUSTER"
fi

# ------------------------------------------------------------------------ fake GPU nodes
# Model-server pods ask for nvidia.com/gpu: kind's node has none, so kwok plays GPU nodes
# (Ready, pods on them Running and Ready, nothing runs), exactly as on the local control plane.
KWOK_BIN="$(find_kwok)"
say "kwok ($KWOK_BIN) for the fake GPU nodes"
"$KWOK_BIN" --kubeconfig "$KUBECONFIG" --config "$ROOT/hack/cluster/kwok-stages.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --node-lease-duration-seconds=40 --cidr=10.250.0.0/16 --node-ip=127.0.0.1 \
  >"$WORK/kwok.log" 2>&1 &
KWOK_PID=$!
cleanup() {
  kill "$KWOK_PID" 2>/dev/null || true
  if [ "${E2E_DELETE_CLUSTER:-0}" = 1 ]; then kind delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT
"$PYTHON" "$ROOT/e2e/cluster/controlplane.py" fake-nodes 2 | kubectl apply -f -
kubectl wait --for=condition=Ready node -l type=kwok --timeout=90s \
  || { tail -n 40 "$WORK/kwok.log" >&2; die "the kwok nodes did not become Ready"; }

# ------------------------------------------------------------------------ the chart
for ns in "$RELEASE_NS" "$WATCH_NS"; do
  kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
done
# Our APIService only where nobody else owns the group (a fresh kind cluster: nobody).
owner="$(kubectl get apiservice "$APISERVICE" -o jsonpath='{.spec.service.namespace}' \
  2>/dev/null || true)"
api_service=true
if [ -n "$owner" ] && [ "$owner" != "$RELEASE_NS" ]; then
  echo "note: $APISERVICE belongs to namespace $owner: installing without our APIService"
  api_service=false
fi
# The chart's pods must run on the real node: a kwok node would report them Ready while
# nothing runs (the chart's default spreads operator replicas only where possible).
cat >"$WORK/values.yaml" <<EOF
image:
  repository: ${IMAGE%:*}
  tag: "${IMAGE##*:}"
  pullPolicy: Never
operator:
  watchNamespaces: [$WATCH_NS]
  affinity: &real-node
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: type, operator: NotIn, values: [kwok]}
adapter:
  apiService:
    enabled: $api_service
  affinity: *real-node
EOF
say "helm upgrade --install $RELEASE"
"$HELM" upgrade --install "$RELEASE" "$ROOT/charts/prefix-router" --namespace "$RELEASE_NS" \
  -f "$WORK/values.yaml" --wait --timeout 5m

# ------------------------------------------------------------------------ the release works
say "checking the release"
kubectl -n "$RELEASE_NS" wait --for=condition=Available deployment --all --timeout=180s
if [ "$api_service" = true ]; then
  kubectl wait --for=condition=Available "apiservice/$APISERVICE" --timeout=120s
  kubectl get --raw "/apis/external.metrics.k8s.io/v1beta1" | grep -q prefix_router_working_set_tokens \
    || die "the aggregated API does not list prefix_router_working_set_tokens"
fi
# A model for the in-cluster operator: its model servers land on the kwok GPU nodes.
kubectl apply -n "$WATCH_NS" -f - <<'EOF'
apiVersion: prefixrouter.io/v1alpha1
kind: PrefixRoutedModel
metadata:
  name: smoke
spec:
  replicas: 2
  model:
    name: llama
    source: meta-llama/Llama-3.1-8B-Instruct
EOF
kubectl wait -n "$WATCH_NS" --for=condition=ModelServersReady prm/smoke --timeout=180s \
  || { kubectl -n "$RELEASE_NS" logs deploy/"$RELEASE"-operator --tail=60 >&2 || true;
       die "the in-cluster operator did not bring the smoke model's servers up"; }
kubectl get prm -n "$WATCH_NS" smoke
kubectl delete prm -n "$WATCH_NS" smoke --wait=false

# ------------------------------------------------------------------------ the suite
say "pytest tests/k8s against $CLUSTER"
cd "$ROOT"
PREFIXROUTER_USE_EXISTING_CLUSTER=1 "$PYTHON" -m pytest tests/k8s "$@"
