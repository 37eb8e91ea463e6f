#!/usr/bin/env bash
# Builds the local Kubernetes control plane the tests start (stride.testing.kube) into
# .cache/kube/bin, from pinned Go modules: no container runtime, no downloaded release
# archive, the same binaries on every machine with Go.
#
# Each tool is rebuilt only when its binary is missing or its pinned version differs from the
# one recorded in .cache/kube/bin/VERSIONS, so `make kube-tools` (which the tests call) is
# silent and instant once everything is built. The first build takes minutes (the Kubernetes
# control plane is large); later version bumps reuse Go's module and build caches.
#
# The versions below are the only place they are pinned; tools/kube/kubernetes/go.mod must
# require the same Kubernetes release (it also pins the staging modules; this script checks).
set -euo pipefail

KUBERNETES_VERSION=v1.34.4 # kube-apiserver, kube-controller-manager, kube-scheduler
KINE_VERSION=v0.17.5       # etcd's API on SQLite, so no etcd to build or run
KWOK_VERSION=v0.7.0        # fake kubelets: pods on its nodes go Running without containers
HELM_VERSION=v3.22.0       # installs the Stride chart into the test cluster

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/.cache/kube/bin"
STAMP="$BIN/VERSIONS"
KUBE_MODULE="$ROOT/tools/kube/kubernetes"

if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then
    PATH="/usr/local/go/bin:$PATH"
  else
    echo "error: go not found; building the test control plane needs Go >= 1.26" >&2
    exit 1
  fi
fi
# The modules are built outside any git checkout of theirs.
export GOFLAGS="${GOFLAGS:--buildvcs=false}"

mkdir -p "$BIN"
# Two test processes may call this at once on a fresh machine: one builds, the other waits.
exec 9>"$BIN/.lock"
flock 9

recorded() { # the version VERSIONS records for binary $1, or nothing
  [ -f "$STAMP" ] && awk -v name="$1" '$1 == name { print $2 }' "$STAMP"
}

record() { # record binary $1 as built at version $2
  local kept
  kept="$( [ -f "$STAMP" ] && awk -v name="$1" '$1 != name' "$STAMP" || true)"
  printf '%s\n%s %s\n' "$kept" "$1" "$2" | sed '/^$/d' | sort > "$STAMP.tmp"
  mv "$STAMP.tmp" "$STAMP"
}

needed() { # true when any of the binaries $2... is missing or not recorded at version $1
  local version="$1" name
  shift
  for name in "$@"; do
    if [ ! -x "$BIN/$name" ] || [ "$(recorded "$name")" != "$version" ]; then
      return 0
    fi
  done
  return 1
}

timed() { # run "$@" and say how long building $1 took
  local what="$1" start=$SECONDS
  shift
  echo "kube-tools: building $what ..."
  "$@"
  echo "kube-tools: built $what in $((SECONDS - start))s"
}

build_kubernetes() {
  if ! grep -q "^require k8s.io/kubernetes $KUBERNETES_VERSION\$" "$KUBE_MODULE/go.mod"; then
    echo "error: $KUBE_MODULE/go.mod does not require k8s.io/kubernetes $KUBERNETES_VERSION;" \
      "pin the same release there (and its staging modules)" >&2
    exit 1
  fi
  # What the Kubernetes release build stamps (hack/lib/version.sh): without it the servers
  # report v0.0.0, and Helm charts with a kubeVersion constraint refuse to install.
  local minor="${KUBERNETES_VERSION#v1.}" flags="-s -w" package
  minor="${minor%%.*}"
  for package in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=" -X $package.gitVersion=$KUBERNETES_VERSION -X $package.gitMajor=1"
    flags+=" -X $package.gitMinor=$minor -X $package.gitTreeState=clean"
  done
  (cd "$KUBE_MODULE" && go build -trimpath -ldflags "$flags" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler)
}

install() { # go install package $1 at version $2 into $BIN with extra link flags $3
  GOBIN="$BIN" go install -trimpath -ldflags "-s -w $3" "$1@$2"
}

if needed "$KUBERNETES_VERSION" kube-apiserver kube-controller-manager kube-scheduler; then
  timed "kube-apiserver, kube-controller-manager, kube-scheduler $KUBERNETES_VERSION" \
    build_kubernetes
  for name in kube-apiserver kube-controller-manager kube-scheduler; do
    record "$name" "$KUBERNETES_VERSION"
  done
fi

if needed "$KINE_VERSION" kine; then
  # cgo: kine's SQLite driver is then mattn/go-sqlite3 (as in k3s), not the slower pure-Go
  # translation it falls back to without a C compiler.
  CGO_ENABLED=1 timed "kine $KINE_VERSION" install github.com/k3s-io/kine "$KINE_VERSION" \
    "-X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION"
  record kine "$KINE_VERSION"
fi

if needed "$KWOK_VERSION" kwok; then
  timed "kwok $KWOK_VERSION" install sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION" \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
  record kwok "$KWOK_VERSION"
fi

if needed "$HELM_VERSION" helm; then
  timed "helm $HELM_VERSION" install helm.sh/helm/v3/cmd/helm "$HELM_VERSION" \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  record helm "$HELM_VERSION"
fi
