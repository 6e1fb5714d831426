#!/usr/bin/env bash
# MIG mode helpers of the driver and MIG steps (sent after guest_lib.sh). Never run alone.
#
# MIG mode is a per-GPU setting that on A100/A30 only takes effect at a GPU reset (NVIDIA MIG User Guide,
# "Deployment Considerations": "Setting MIG mode on the A100/A30 requires a GPU reset"; the mode then persists
# across reboots). Hopper is different: see mig_mode_boot.
# `nvidia-smi -i N -mig 1|0` sets the PENDING mode; the driver tries to reset the GPU at once, which fails while a
# client holds it and, in a passthrough VM, often cannot happen at all: NVML then reports mig.mode.pending !=
# mig.mode.current ("Warning: MIG mode is in pending enable state ... Reboot the system or try nvidia-smi
# --gpu-reset") until the function is reset. `nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending
# --format=csv,noheader` reads both ("[N/A]" on a GPU without MIG). A guest reboot does not reliably reset a
# passed-through GPU; a new QEMU process does (vfio-pci resets the function when the VM starts): the Proxmox-side
# mig-restart step (mig_restart.sh) stops and starts the VM when the line below says so.
#
# The wanted modes come as `--mig-mode INDEX=1|0` (one per MIG-capable GPU, the guest's nvidia-smi index): to the
# driver step in host driver mode, and to the MIG steps in host and operator driver modes.
# MIG_RESTART is 1 after mig_mode_report found a GPU whose mode waits for a reset.
# Prints "mig-mode: GPU <i> <Enabled|Disabled> (current <x>, pending <y>)" per GPU and finally one machine-readable
# line: "mig-restart: not-needed" or "mig-restart: needed (<why>)".
set -euo pipefail

MIG_MODES=() MIG_STATE="" MIG_CURRENT="" MIG_PENDING="" MIG_RESTART=0

# mig_mode_arg <flag> <value>: consume one --mig-mode argument; returns 1 for any other flag.
mig_mode_arg() {
  [[ "$1" == --mig-mode ]] || return 1
  [[ "$2" =~ ^[0-9]{1,2}=[01]$ ]] || fail "--mig-mode" "INDEX=1 or INDEX=0" "'$2'"
  MIG_MODES+=("$2")
}

# MIG_DRIVER_ROOT: where the GPU Operator's driver container shows its root file system on the node (its
# driver.root, /run/nvidia/driver); its nvidia-smi runs there with chroot, as the operator's own tools do.
MIG_DRIVER_ROOT="/run/nvidia/driver"

# mig_driver: an NVIDIA driver's nvidia-smi is there: the host driver's, or the operator's container's (not yet on a
# first provisioning in operator mode: the MIG begin step then leaves the mode to the restart step, whose guest side
# waits for the container, guest_mig.sh mig_driver_wait).
mig_driver() {
  command -v nvidia-smi >/dev/null || [[ -x "$ROOT$MIG_DRIVER_ROOT/usr/bin/nvidia-smi" ]]
}

# mig_smi <nvidia-smi arguments...>: the host driver's nvidia-smi, else the driver container's.
mig_smi() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi "$@"
  else
    chroot "$ROOT$MIG_DRIVER_ROOT" nvidia-smi "$@"
  fi
}

# mig_mode_query: MIG_STATE = "<index> <current> <pending>" per GPU, from NVML. (Globals, not output: a failure
# inside $(...) would print its line twice, once more from the ERR trap.)
mig_mode_query() {
  local out rc=0
  out="$(mig_smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader 2>&1)" || rc=$?
  ((rc == 0)) || fail_output "$out" "nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending" "the GPUs' MIG modes" "$rc"
  MIG_STATE="${out//,/}"
}

# mig_word <0|1>: NVML's name of the mode.
mig_word() {
  if [[ "$1" == 1 ]]; then echo Enabled; else echo Disabled; fi
}

# mig_mode_of <index>: MIG_CURRENT and MIG_PENDING of that GPU in MIG_STATE; fails when it has no MIG.
mig_mode_of() {
  local index current pending
  while read -r index current pending; do
    if [[ "$index" == "$1" ]]; then
      [[ "$current" =~ ^(Enabled|Disabled)$ ]] || fail "GPU $1" "a MIG-capable GPU (MIG mode Enabled or Disabled)" "$current"
      MIG_CURRENT="$current" MIG_PENDING="$pending"
      return 0
    fi
  done <<<"$MIG_STATE"
  fail "GPU $1" "a GPU with nvidia-smi index $1" "indexes $(cut -d' ' -f1 <<<"$MIG_STATE" | paste -sd, - || true)"
}

# mig_mode_apply: set the pending mode of every GPU whose pending mode is not the wanted one (no call otherwise),
# then report what runs now and the machine-readable mig-restart line. Decided from NVML on every run.
mig_mode_apply() {
  local pair index want out rc
  ((${#MIG_MODES[@]})) || return 0
  mig_mode_query
  for pair in "${MIG_MODES[@]}"; do
    index="${pair%=*}" want="$(mig_word "${pair#*=}")"
    mig_mode_of "$index"
    if [[ "$MIG_PENDING" != "$want" ]]; then
      rc=0
      out="$(mig_smi -i "$index" -mig "${pair#*=}" 2>&1)" || rc=$?
      ((rc == 0)) || fail_output "$out" "nvidia-smi -i $index -mig ${pair#*=}" "MIG mode $want set" "$rc"
      echo "changed: GPU $index MIG mode $want"
    fi
  done
  mig_mode_boot
  mig_mode_report
}

# Hopper and later GPUs (H100, H200) apply a MIG mode change at once, without a GPU reset, and lose it at every
# reboot, driver reload or VM restart (NVIDIA MIG User Guide, "Enable MIG Mode" and "GPU Reset on Hopper+"): such a
# worker would come back advertising whole GPUs. With the host driver (nvidia-smi on the guest) a boot unit sets the
# wanted modes again before containerd and kubelet start, so the device plugin and mig-manager find them; where the
# mode persists (A100, A30) it finds them set and changes nothing. With the GPU Operator's driver container no
# nvidia-smi runs before the container does: there mig-manager, which runs its reconfigure for the node's label at
# every start (NVIDIA/mig-parted cmd/nvidia-mig-manager/main.go: the informer's AddFunc; pkg/mig/reconfigure
# reconfigure.go Run: assert, else apply --mode-only, which Hopper applies at once, then the geometry), restores the
# mode and the geometry after each boot.
MIG_BOOT_UNIT="/etc/systemd/system/proxmox-gpu-cluster-mig-mode.service"
MIG_BOOT_SCRIPT="/usr/local/sbin/proxmox-gpu-cluster-mig-mode"

# mig_mode_boot: the boot unit and its script for the wanted modes (host driver only), enabled; changes nothing when
# they are in place.
mig_mode_boot() {
  local script unit out rc=0
  command -v nvidia-smi >/dev/null || return 0
  script="$(
    cat <<'SCRIPT'
#!/bin/sh
# Written by proxmox-gpu-cluster (guest_mig_mode.sh): the wanted MIG mode of each GPU, set at every boot where the
# GPU does not run it (Hopper loses it at every boot).
set -eu
state=$(nvidia-smi --query-gpu=index,mig.mode.current,mig.mode.pending --format=csv,noheader)
for pair in @MODES@; do
  i=${pair%=*} v=${pair#*=} want=Disabled
  [ "$v" = 0 ] || want=Enabled
  current=$(printf '%s\n' "$state" | awk -F', ' -v i="$i" '$1 == i { print $2 }')
  [ "$current" = "$want" ] || nvidia-smi -i "$i" -mig "$v"
done
SCRIPT
  )"
  script="${script/@MODES@/${MIG_MODES[*]}}"
  unit="[Unit]
Description=proxmox-gpu-cluster: the GPUs' MIG mode (lost at every boot on Hopper)
After=systemd-modules-load.service nvidia-persistenced.service
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$MIG_BOOT_SCRIPT

[Install]
WantedBy=multi-user.target"
  put "$MIG_BOOT_SCRIPT" "$script" 0755
  put "$MIG_BOOT_UNIT" "$unit"
  systemctl is-enabled --quiet proxmox-gpu-cluster-mig-mode 2>/dev/null && return 0
  out="$(systemctl enable proxmox-gpu-cluster-mig-mode 2>&1)" || rc=$?
  ((rc == 0)) || fail_output "$out" "systemctl enable proxmox-gpu-cluster-mig-mode" "the MIG mode boot unit enabled" "$rc"
  echo "changed: proxmox-gpu-cluster-mig-mode.service enabled"
}

# mig_mode_report: one line per GPU and the mig-restart line (changes nothing).
mig_mode_report() {
  local pair index want joined why=()
  ((${#MIG_MODES[@]})) || return 0
  mig_mode_query
  for pair in "${MIG_MODES[@]}"; do
    index="${pair%=*}" want="$(mig_word "${pair#*=}")"
    mig_mode_of "$index"
    echo "mig-mode: GPU $index $want (current $MIG_CURRENT, pending $MIG_PENDING)"
    [[ "$MIG_CURRENT" == "$want" ]] || why+=("GPU $index MIG mode $MIG_CURRENT, $want pending a GPU reset")
  done
  MIG_RESTART=$((${#why[@]} > 0))
  if ((MIG_RESTART)); then
    printf -v joined '%s; ' "${why[@]}"
    echo "mig-restart: needed (${joined%; })"
  else
    echo "mig-restart: not-needed"
  fi
}

# mig_mode_due: some GPU does not run the wanted mode or has another one pending (changes nothing).
mig_mode_due() {
  local pair want
  ((${#MIG_MODES[@]})) || return 1
  mig_mode_query
  for pair in "${MIG_MODES[@]}"; do
    want="$(mig_word "${pair#*=}")"
    mig_mode_of "${pair%=*}"
    [[ "$MIG_CURRENT" == "$want" && "$MIG_PENDING" == "$want" ]] || return 0
  done
  return 1
}
