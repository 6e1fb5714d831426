#!/usr/bin/env bash
# Step 3 of the guest bootstrap: containerd with the systemd cgroup driver and, when the host owns the driver,
# the NVIDIA Container Toolkit from NVIDIA's apt repository, pinned and held, registered with containerd.
# Sent after guest_lib.sh.
#
# Usage: guest_runtime.sh --toolkit 0|1 [--toolkit-version V] [--default-runtime 0|1] [--cdi 0|1]
# --toolkit 0: the GPU Operator's toolkit container configures containerd itself; only containerd is set up.
# containerd restarts when the configuration it was last restarted with (a fingerprint recorded after each restart
# under $STATE_DIR) is not the configuration on disk: a run killed between writing the files and the restart
# restarts it next time. containerd's files alone cannot tell (`containerd config dump` reads the files, not the
# daemon); the verify step checks the running daemon with `crictl info`.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="runtime"

toolkit=0 toolkit_version="" default_runtime=1 cdi=0
while (($#)); do
  case "$1" in
  --toolkit) toolkit="$2" ;;
  --toolkit-version) toolkit_version="$2" ;;
  --default-runtime) default_runtime="$2" ;;
  --cdi) cdi="$2" ;;
  *) die "unknown argument $1" ;;
  esac
  shift 2
done
[[ "$toolkit" =~ ^[01]$ && "$default_runtime" =~ ^[01]$ && "$cdi" =~ ^[01]$ ]] ||
  fail "arguments" "0 or 1 for --toolkit, --default-runtime and --cdi" "'$toolkit' '$default_runtime' '$cdi'"
if ((toolkit)); then
  [[ "$toolkit_version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(~rc\.[0-9]+)?-[0-9]+$ ]] ||
    fail "--toolkit-version" "an apt version like 1.18.2-1" "'$toolkit_version'"
fi

CONFIG="/etc/containerd/config.toml"
# Where nvidia-ctk 1.18 writes the nvidia runtime (runtime configure's --drop-in-config default) and what it imports.
DROP_IN_DIR="/etc/containerd/conf.d"
DROP_IN="$DROP_IN_DIR/99-nvidia.toml"
TOOLKIT_PACKAGES=(nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1)
# Where nvidia-cdi-refresh (toolkit 1.18+) writes too: one spec file, never two that define the same devices.
CDI_SPEC="/var/run/cdi/nvidia.yaml"

# containerd_state: the main config and every drop-in, to tell whether anything changed.
containerd_state() {
  cat "$ROOT$CONFIG" "$ROOT"/etc/containerd/conf.d/*.toml 2>/dev/null || true
}

setup_containerd() {
  local config
  if [[ -z "$(installed_version containerd)$(installed_version containerd.io)" ]]; then
    apt_install containerd
  fi
  config="$(cat "$ROOT$CONFIG" 2>/dev/null || true)"
  # Missing, or Docker's containerd.io stub (CRI disabled, nothing else): start from containerd's defaults.
  if [[ -z "$config" ]] || grep -qE '^[[:space:]]*disabled_plugins[[:space:]]*=[[:space:]]*\["cri"\]' <<<"$config"; then
    config="$(containerd config default)"
  fi
  # kubelet uses the systemd cgroup driver (kubeadm's default since 1.22); runc must match it.
  config="$(systemd_cgroup <<<"$config")" || fail "$CONFIG" "a runc runtime to set SystemdCgroup on" "none"
  put "$CONFIG" "$config"
}

# systemd_cgroup: the config on stdin with SystemdCgroup = true for runc (and every runtime that names it). Where
# runc's options table lacks the line it is added: containerd 2.0.0-2.0.6 and 2.1.0-2.1.4 print their default
# config without it (internal/cri/config/config_unix.go; restored by containerd commit 56cde7d2c). Table headers
# are compared without quotes and blanks, any plugin's `runtimes.runc`: 2.x prints
# plugins.'io.containerd.cri.v1.runtime' (config version 3), 1.x plugins."io.containerd.grpc.v1.cri" (version 2).
# A runc table without an options table gets one. Fails (exit 1) when the config has no runc runtime table at all
# (runc's settings are then containerd's built-in ones, which a file cannot amend without restating the runtime).
systemd_cgroup() {
  awk '
    function runc(name) {
      return name ~ /^plugins\..*\.runtimes\.runc$/
    }
    { line[NR] = $0 }
    /^[[:space:]]*\[[^[]/ {
      current = $0; sub(/^[[:space:]]*\[/, "", current); sub(/\][[:space:]]*(#.*)?$/, "", current)
      gsub(/["\047[:space:]]/, "", current)
      indent = $0; sub(/[^[:space:]].*$/, "", indent)
      in_options = current ~ /\.options$/ && runc(substr(current, 1, length(current) - 8))
      if (runc(current)) { runc_at = NR; runc_indent = indent }
      if (in_options) { options_at = NR; options_indent = indent }
    }
    /^[[:space:]]*SystemdCgroup[[:space:]]*=/ { sub(/=[[:space:]]*false/, "= true", line[NR]); if (in_options) { have = 1 } }
    /^[[:space:]]*options[[:space:]]*=/ { if (runc(current)) { inline = 1 } }
    END {
      if (!options_at && (!runc_at || inline)) { exit 1 }
      for (i = 1; i <= NR; i++) {
        print line[i]
        if (i == options_at && !have) { print options_indent "  SystemdCgroup = true" }
      }
      if (!options_at) {
        header = line[runc_at]; sub(/^[[:space:]]*/, "", header); sub(/\][[:space:]]*(#.*)?$/, ".options]", header)
        print ""; print runc_indent "  " header; print runc_indent "    SystemdCgroup = true"
      }
    }'
}

# other_cri_files: the files config.toml imports, besides the toolkit's drop-in, that hold a CRI plugin table.
# nvidia-ctk copies config.toml's whole CRI table into its drop-in (toolkit 1.18 pkg/config/engine/containerd,
# getBaseDropInConfigTree), which containerd loads last: containerd 1.7 then drops the other file's whole CRI table
# (imports replace plugin tables, services/server/config/config.go mergeConfig) and 2.x lets the copied keys win,
# so their settings would silently not apply. CRI settings belong in config.toml.
other_cri_files() {
  local pattern file
  local -a patterns=("$DROP_IN_DIR/*.toml")
  mapfile -t -O 1 patterns < <(sed -nE 's/^[[:space:]]*imports[[:space:]]*=[[:space:]]*\[(.*)\].*/\1/p' \
    "$ROOT$CONFIG" 2>/dev/null | grep -oE "[\"'][^\"']+[\"']" | tr -d "\"'")
  for pattern in "${patterns[@]}"; do
    [[ "$pattern" == /* ]] || pattern="$(dirname "$CONFIG")/$pattern" # containerd: relative to config.toml's folder
    for file in "$ROOT"$pattern; do
      [[ -f "$file" && "${file#"$ROOT"}" != "$DROP_IN" ]] || continue
      grep -qE "^[[:space:]]*\[[[:space:]]*plugins[[:space:]]*\.[[:space:]]*[\"']?(io\.containerd\.grpc\.v1\.cri|io\.containerd\.cri\.v1\.runtime|cri)[\"']?[[:space:]]*[].]" \
        "$file" && echo "${file#"$ROOT"}"
    done
  done | sort -u
}

setup_toolkit() {
  local pkg current=1 args others
  others="$(other_cri_files | paste -sd' ')"
  [[ -z "$others" ]] ||
    fail "$others" "the CRI settings in $CONFIG (the toolkit's drop-in replaces other files' CRI table)" \
      "a CRI plugin table"
  # shellcheck disable=SC2016 # $(ARCH) is apt's own variable in sources.list, not a shell expansion
  apt_repo nvidia-container-toolkit https://nvidia.github.io/libnvidia-container/gpgkey \
    'https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /'
  for pkg in "${TOOLKIT_PACKAGES[@]}"; do
    [[ "$(installed_version "$pkg")" == "$toolkit_version" ]] || current=0
  done
  if ((current)); then
    echo "toolkit: $toolkit_version (present)"
  else
    apt_install "${TOOLKIT_PACKAGES[@]/%/=$toolkit_version}"
  fi
  hold "${TOOLKIT_PACKAGES[@]}"
  # Adds the nvidia runtime (copying runc's options, SystemdCgroup included, hence after setup_containerd).
  # Toolkit 1.18 (config source "file": config.toml alone) writes the drop-in $DROP_IN holding config.toml's
  # WHOLE CRI table plus the nvidia runtime (containerd 1.7 imports replace whole plugin tables), and rewrites
  # config.toml with the drop-in's folder in `imports` (re-serialised: comments go). Re-running it rewrites the same
  # content; tests/components/scripts/test_real_containerd.py runs the real 1.18.2 against the real containerd.
  args=(runtime configure --runtime=containerd)
  ((default_runtime)) && args+=(--set-as-default)
  # With CDI the operator's device plugin hands out CDI device names, which containerd resolves only with its CRI
  # plugin's enable_cdi on: off by default in containerd 1.7 (pkg/cri/config), on in 2.0. nvidia-ctk sets it
  # in the same drop-in (runtime configure --cdi.enabled, "Enable CDI in the configured runtime").
  ((cdi)) && args+=(--cdi.enabled)
  tool "nvidia-ctk runtime configure" nvidia-ctk "${args[@]}" >/dev/null
  if ((cdi)); then
    # The spec lists the GPUs and MIG devices that exist now. nvidia-cdi-refresh (toolkit 1.18+) regenerates
    # it at boot and on driver changes, but not after the MIG manager repartitions a GPU
    # (NVIDIA/nvidia-container-toolkit#1828): MIG entries are then stale until `nvidia-ctk cdi generate` runs
    # again. Pods are not affected (with cdi.enabled the operator's device plugin generates the specs of the
    # devices it hands out, and the MIG manager restarts it after a change); containers started outside
    # Kubernetes (ctr, nerdctl) are.
    if [[ ! -s "$ROOT$CDI_SPEC" ]]; then
      mkdir -p "$(dirname "$ROOT$CDI_SPEC")"
      # Into a temp file renamed once complete: a killed run leaves no partial spec that would count as done.
      tool "nvidia-ctk cdi generate" nvidia-ctk cdi generate --output="$ROOT$CDI_SPEC.pgc-new" >/dev/null
      sync "$ROOT$CDI_SPEC.pgc-new"
      mv -f "$ROOT$CDI_SPEC.pgc-new" "$ROOT$CDI_SPEC"
      echo "changed: $CDI_SPEC"
    fi
  fi
}

# remove_host_toolkit: --toolkit 0 on a node where host driver mode set the toolkit up (driverMode now operator, or a
# KubeVirt workload): its drop-in goes first (only the one that runs the host's /usr/bin/nvidia-container-runtime:
# the operator's toolkit container writes its own runtime, under /usr/local/nvidia), then its packages, so the
# operator's toolkit container alone configures containerd. config.toml keeps its CRI table, SystemdCgroup included
# (setup_containerd), so containerd falls back to runc with the systemd cgroup driver.
remove_host_toolkit() {
  local pkg pkgs=()
  if grep -qs '"/usr/bin/nvidia-container-runtime"' "$ROOT$DROP_IN"; then
    drop "$DROP_IN"
    echo "changed: $DROP_IN removed (the host toolkit's)"
  fi
  for pkg in "${TOOLKIT_PACKAGES[@]}"; do
    [[ -z "$(installed_version "$pkg")" ]] || pkgs+=("$pkg")
  done
  ((${#pkgs[@]})) || return 0
  tool "apt-mark unhold" apt-mark unhold "${pkgs[@]}" >/dev/null
  apt "apt-get purge" purge -y -q "${pkgs[@]}"
  echo "toolkit: host toolkit removed (${pkgs[*]})"
}

# applied: the fingerprint of the configuration containerd was last restarted with by this step.
APPLIED="$STATE_DIR/containerd.applied"

main() {
  local now
  guest_begin
  setup_containerd
  if ((toolkit)); then
    setup_toolkit
  else
    remove_host_toolkit
    echo "toolkit: left to the GPU Operator"
  fi
  now="$(containerd_state | sha256sum | cut -d' ' -f1)"
  if [[ "$(cat "$ROOT$APPLIED" 2>/dev/null || true)" != "$now" ]]; then
    tool "systemctl restart containerd" systemctl restart containerd
    record "$APPLIED" "$now"
    echo "runtime: containerd restarted"
  else
    echo "runtime: containerd unchanged"
  fi
}

main "$@" </dev/null
