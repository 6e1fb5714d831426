# kube-apiserver and kubectl, for the node agent's Kubernetes tests (Node authorizer, NodeRestriction, RBAC, eviction
# with PDBs): the agent talks to the API server through kubectl (components/agent/kubeapi.py), so the tests run the
# same kubectl minor as the server.
# 1.34 lies in the range the pinned GPU Operator release is validated on (components/core/validation_operator.py);
# v1.34.4 is the newest 1.34 patch the Go module proxy served when this was pinned.
VERSION=v1.34.4
PROVIDES="kube-apiserver kubectl"

build() {
  # k8s.io/kubernetes's go.mod replaces its staging modules (k8s.io/api, k8s.io/apiserver, ...) with ./staging/...
  # paths, so `go install k8s.io/kubernetes/cmd/kube-apiserver@v1.34.4` refuses ("contains replace directives").
  # A throwaway module requires it and points every staging module at its published twin, v0.<minor>.<patch>
  # (k8s.io/kubernetes README "Using Kubernetes as a library" is not supported; this is the known workaround).
  local staging="v0.${VERSION#v1.}"
  go mod init pgc-tools/kube-apiserver >/dev/null 2>&1
  go mod edit -go=1.24 -require="k8s.io/kubernetes@$VERSION"
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@$VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
  # Every `k8s.io/<name> => ./staging/src/k8s.io/<name>` line of its go.mod becomes a replace by the published module.
  sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$gomod" | while read -r mod; do
    go mod edit -replace="$mod=$mod@$staging"
  done
  # A tools file (build tag: never compiled) records both commands, so `go mod tidy` resolves their packages.
  printf '//go:build tools\n\npackage main\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n' > tools.go
  go mod tidy >/dev/null
  # The version is stamped as the upstream build does (hack/lib/version.sh sets these -X values), else /version and
  # kubectl version say v0.0.0-master.
  local minor flags="" p
  minor="$(echo "$VERSION" | cut -d. -f2)"
  for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=" -X $p.gitVersion=$VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  go build -ldflags "$flags" -o "$OUT/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
  go build -ldflags "$flags" -o "$OUT/kubectl" k8s.io/kubernetes/cmd/kubectl
}
