# shellcheck shell=bash disable=SC2034 # sourced by tools/tools.sh, which reads VERSION and PROVIDES
# containerd 2.0.5: its default config has no SystemdCgroup line for runc (internal/cri/config/config_unix.go in
# v2.0.0-v2.0.6 and v2.1.0-v2.1.4; restored by commit 56cde7d2c), the case the runtime step must still handle.
VERSION=v2.0.5
PROVIDES="containerd-2.0"
build() {
  go mod init pgc.invalid/tools >/dev/null 2>&1
  go get "github.com/containerd/containerd/v2@$VERSION" >/dev/null
  go build -ldflags "-X github.com/containerd/containerd/v2/version.Version=$VERSION" \
    -o "$OUT/containerd-2.0" github.com/containerd/containerd/v2/cmd/containerd
}
