#!/usr/bin/env bash
# `make test-k8s`: qualifies the kubernetes backend and the Helm chart on a real cluster,
# in one command, or fails saying why (docs/kubernetes.md, What is tested):
#   1. tests/integration/test_chart_cluster.py installs helm/acp-worker with `helm` and
#      runs a job through it, then writes a kubeconfig acting as the chart's
#      ServiceAccount (a token of it);
#   2. the backend's modules (backend, files, masks, mid-run, network, warm slots) run
#      with that kubeconfig, so their RBAC is the one the chart grants, against the chart's
#      sandbox namespace and NetworkPolicies (the backend creates none: they are the
#      chart's);
#   3. the release is uninstalled, whatever happened.
# No KUBECONFIG: exit 2 with the message (a skipped qualification is not a pass).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${KUBECONFIG:-}" ]; then
  echo "test-k8s: FAILED: KUBECONFIG is not set, so there is no cluster to qualify the" \
    "kubernetes backend and the Helm chart against. Point KUBECONFIG at one (kind, k3s," \
    "a cloud cluster) and set ACPW_TEST_K8S_REGISTRY, ACPW_TEST_K8S_WORKER_IMAGE and" \
    "ACPW_TEST_K8S_REDIS_URL (docs/kubernetes.md). make test runs the backend's suite" \
    "against the API double, which qualifies no cluster." >&2
  exit 2
fi
missing=()
for tool in helm kubectl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("a \`$tool\` binary on PATH")
done
for name in ACPW_TEST_K8S_REGISTRY ACPW_TEST_K8S_WORKER_IMAGE ACPW_TEST_K8S_REDIS_URL; do
  [ -n "${!name:-}" ] || missing+=("$name")
done
if [ "${#missing[@]}" -gt 0 ]; then
  printf 'test-k8s: FAILED: missing %s\n' "${missing[@]}" >&2
  echo "test-k8s: see docs/kubernetes.md (What is tested) for what each is" >&2
  exit 2
fi

./scripts/bootstrap.sh
PY=${PY:-.venv/bin/python}
export ACPW_TEST_KUBECONFIG="$KUBECONFIG"
export ACPW_TEST_K8S_RELEASE_NAMESPACE=${ACPW_TEST_K8S_RELEASE_NAMESPACE:-acpw-test-system}
export ACPW_TEST_K8S_NAMESPACE=${ACPW_TEST_K8S_NAMESPACE:-acpw-test-sandboxes}
work=$(mktemp -d)
cleanup() {
  helm uninstall acpw-test --namespace "$ACPW_TEST_K8S_RELEASE_NAMESPACE" --wait \
    --timeout 10m >/dev/null 2>&1 || echo "test-k8s: could not uninstall the release acpw-test" >&2
  rm -rf "$work"
}
trap cleanup EXIT
export ACPW_TEST_K8S_SA_KUBECONFIG="$work/service-account.kubeconfig"

"$PY" -m pytest -q -p no:cacheprovider -rs tests/integration/test_chart_cluster.py "$@"
[ -s "$ACPW_TEST_K8S_SA_KUBECONFIG" ] || {
  echo "test-k8s: FAILED: the chart's test wrote no ServiceAccount kubeconfig" >&2
  exit 1
}
ACPW_TEST_KUBECONFIG="$ACPW_TEST_K8S_SA_KUBECONFIG" ACPW_K8S_NETWORK_POLICIES=external \
  "$PY" -m pytest -q -p no:cacheprovider -rs \
  tests/integration/test_kubernetes_backend.py tests/integration/test_kubernetes_files.py \
  tests/integration/test_kubernetes_masks.py tests/integration/test_kubernetes_midrun.py \
  tests/integration/test_kubernetes_network.py tests/integration/test_warm_kubernetes.py "$@"
