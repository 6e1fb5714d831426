# shellcheck shell=bash disable=SC2034 # sourced by tools/tools.sh, which reads VERSION and PROVIDES
# The Pulumi CLI (the engine every user runs: `pulumi preview`/`up`), from the Go module proxy: the newest 3.x it
# served when this was pinned. At least the project's minimum CLI (components/engine_version.py MINIMUM_CLI) and
# newer than the Python SDK the project installs, as Pulumi releases are meant to be used (the engine speaks every
# older SDK's protocol).
# Not built, because the module proxy here refuses them (403 "This module version is not available", checked
# 2026-11-28): the Python language host (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3, a
# module of its own, so not in sdk/v3's zip) and the pulumi-command and pulumi-proxmoxve provider modules. The tests
# run Python programs under this CLI through the SDK's own language server (automation API inline programs,
# tests/pulumi_real.py), which is what the CLI talks to instead of pulumi-language-python.
VERSION=v3.276.0
PROVIDES="pulumi"
build() {
  go mod init pgc.invalid/pulumi >/dev/null 2>&1
  go get "github.com/pulumi/pulumi/pkg/v3@$VERSION" >/dev/null
  # The version the CLI reports (`pulumi version`, and what the engine answers RequirePulumiVersion with).
  go build -ldflags "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$VERSION" \
    -o "$OUT/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
}
