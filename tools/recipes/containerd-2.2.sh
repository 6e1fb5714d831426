# shellcheck shell=bash disable=SC2034 # sourced by tools/tools.sh, which reads VERSION and PROVIDES
# containerd 2.2: a 2.x whose default config prints SystemdCgroup again (config version 3).
VERSION=v2.2.1
PROVIDES="containerd-2.2"
build() {
  go mod init pgc.invalid/tools >/dev/null 2>&1
  go get "github.com/containerd/containerd/v2@$VERSION" >/dev/null
  go build -ldflags "-X github.com/containerd/containerd/v2/version.Version=$VERSION" \
    -o "$OUT/containerd-2.2" github.com/containerd/containerd/v2/cmd/containerd
}
