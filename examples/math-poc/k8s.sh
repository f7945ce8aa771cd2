#!/usr/bin/env bash
# run.sh's Kubernetes part (the seed's quick start): build the images, load them into minikube, and deploy the
# controller against the gateway run.sh started on the host. Usage: k8s.sh WORKDIR (run.sh calls it).
#
# Needs: minikube running (docker driver), kubectl, docker, deploy/.env (AGL_KEY, AGL_PUBLIC_URL, AGL_IMAGE_TAG).
# Not run by the tests (no cluster and no Docker engine where they run); the manifests it applies are generated
# by `render` below and validated offline by tests/e2e/test_math_poc_k8s.py.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORKDIR="${1:?usage: k8s.sh WORKDIR}"
TAG="${AGL_IMAGE_TAG:-0.1.0}"
PUBLIC_URL="${AGL_PUBLIC_URL:-http://host.minikube.internal:${AGL_DEMO_PORT:-8100}}"

for tool in minikube kubectl docker; do
    command -v "$tool" >/dev/null || { echo "k8s.sh: '$tool' is needed for --runner k8s (see docs/deployment.md)" >&2; exit 2; }
done
minikube status >/dev/null || { echo "k8s.sh: minikube is not running: minikube start --driver=docker" >&2; exit 2; }

# Images: a non-latest tag with imagePullPolicy IfNotPresent, so the cluster uses what `minikube image load` put
# on its node instead of pulling.
docker build -q -f "$ROOT/deploy/Dockerfile" -t "agl-lite:$TAG" "$ROOT"
docker build -q -f "$ROOT/deploy/Dockerfile.agent-python" -t "agl-agent-python:$TAG" "$ROOT/deploy"
docker build -q --build-arg "BASE=agl-agent-python:$TAG" -f "$HERE/Dockerfile" -t "agl-math-agent:$TAG" "$HERE"
for image in "agl-lite:$TAG" "agl-math-agent:$TAG"; do minikube image load "$image"; done

# The controller: deploy/k8s with this example's agent image and the host gateway's URL.
"${AGL_DEMO_PYTHON:-$ROOT/.venv/bin/python}" "$HERE/k8s_manifests.py" --tag "$TAG" --store-url "$PUBLIC_URL" \
    --out "$WORKDIR/k8s"
kubectl apply -f "$WORKDIR/k8s/namespace.yaml"
kubectl -n agl-lite create secret generic agl-lite --from-literal="AGL_KEY=$AGL_KEY" \
    --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f "$WORKDIR/k8s/"
kubectl -n agl-lite rollout status deployment/agl-lite-controller --timeout=180s
