# shellcheck shell=bash disable=SC2034 # sourced by tools/tools.sh, which reads VERSION and PROVIDES
# containerd 1.7 (the branch Ubuntu 24.04 ships), built from its Go module: the version-2 config whose imports
# replace whole plugin tables (services/server/config/config.go, mergeConfig), which the runtime step's tests check.
VERSION=v1.7.28
PROVIDES="containerd-1.7"
build() {
  # A throwaway module that requires containerd: go install refuses modules with replace directives.
  go mod init pgc.invalid/tools >/dev/null 2>&1
  go get "github.com/containerd/containerd@$VERSION" >/dev/null
  # CGO off drops the btrfs snapshotter (cgo-only); config default/dump do not need it.
  go build -ldflags "-X github.com/containerd/containerd/version.Version=$VERSION" \
    -o "$OUT/containerd-1.7" github.com/containerd/containerd/cmd/containerd
}
