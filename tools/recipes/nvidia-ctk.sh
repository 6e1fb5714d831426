# shellcheck shell=bash disable=SC2034 # sourced by tools/tools.sh, which reads VERSION and PROVIDES
# nvidia-ctk at the NVIDIA Container Toolkit version the project installs by default
# (components/core/spec_base.py DEFAULT_TOOLKIT_VERSION 1.18.2-1), from the toolkit's Go module.
VERSION=v1.18.2
PROVIDES="nvidia-ctk"
build() {
  go mod init pgc.invalid/tools >/dev/null 2>&1
  go get "github.com/NVIDIA/nvidia-container-toolkit@$VERSION" >/dev/null
  # go-nvml binds libnvidia-ml with cgo (dlopen at run time, so no NVIDIA library is needed to build or to run
  # the runtime/cdi commands without a GPU).
  CGO_ENABLED=1 go build -ldflags "-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=$VERSION" \
    -o "$OUT/nvidia-ctk" github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk
}
