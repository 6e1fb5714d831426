# etcd, the store kube-apiserver needs. Debian's etcd-server is 3.4.23; Kubernetes 1.34 builds against and ships
# etcd 3.6 (k8s.io/kubernetes v1.34 go.mod: go.etcd.io/etcd/client/v3 v3.6.x; cluster/images/etcd), so the same
# minor is built here: the newest 3.6 patch the Go module proxy served when this was pinned.
VERSION=v3.6.16
PROVIDES="etcd"

build() {
  # etcd's own main package lives in the repository's root module (go.etcd.io/etcd/v3), which is not meant to be
  # installed as a library; a one-line main calling the server module's etcdmain.Main is the same program.
  go mod init pgc-tools/etcd >/dev/null 2>&1
  go mod edit -go=1.24 -require="go.etcd.io/etcd/server/v3@$VERSION"
  printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > main.go
  go mod tidy >/dev/null
  go build -o "$OUT/etcd" .
}
