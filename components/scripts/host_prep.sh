#!/usr/bin/env bash
# Prepare a Proxmox VE node for GPU passthrough: IOMMU kernel arguments, vfio modules, host driver blacklist,
# vfio-pci for the GPUs the node declares.
# Usage: host_prep.sh --cpu-vendor intel|amd --boot-loader grub|systemd-boot|auto --acs-override 0|1
#                     --reboot-policy when-idle|always|never --gpu <domain:bus:device>=<vendor:device> [--gpu ...]
# Every path is under $PGC_ROOT (empty on a real host) so tests can run against a fake root.
#
# Converges from any state: it compares what is wanted with what it observes, never with what this run changed:
# the files (rewritten atomically when they differ); the boot configuration GENERATED from them (GRUB: the default
# entry of /boot/grub/grub.cfg; systemd-boot: the /etc/kernel/cmdline the last successful proxmox-boot-tool refresh
# copied to the ESPs, recorded here as the ESPs are not mounted); the initramfs (a fingerprint of the module files
# the last successful update-initramfs packed, a "pending" marker written before each regeneration); the running
# /proc/cmdline; the live vfio-pci bindings. Only a missing kernel argument (or a GPU that will not unbind) needs
# a reboot; a GPU newly declared on a node running with the IOMMU on is bound at runtime. The reboot follows
# --reboot-policy: when-idle only with no VM or container running (else the step fails naming them), always
# anyway, never: "reboot: required" and left to you. A scheduled reboot is recorded with its boot id: a node that
# came back (new boot id) without what the reboot was for fails the step instead of rebooting again.
# Prints "changed: <file>" per rewritten file, "vfio: ..." per runtime binding, and finally "reboot: scheduled",
# "reboot: required" or "reboot: not-needed". Failures: one line "host-prep: <what>: expected <x>, saw <y>" (a
# tool's own output below it), exit 1.
set -euo pipefail

ROOT="${PGC_ROOT:-}"
STATE="$ROOT/var/lib/proxmox-gpu-cluster"
MARKER="$ROOT/run/proxmox-gpu-cluster/reboot-required"
SCHEDULED="$STATE/reboot-scheduled"
# shellcheck disable=SC2034 # read by host_lib.sh (failure lines, the ERR trap)
STEP="host-prep"
cpu_vendor="" boot_loader="auto" acs_override=0 reboot_policy="when-idle" gpus=() changed=()

while (($#)); do
  case "$1" in
  --cpu-vendor) cpu_vendor="$2" ;;
  --boot-loader) boot_loader="$2" ;;
  --acs-override) acs_override="$2" ;;
  --reboot-policy) reboot_policy="$2" ;;
  --gpu) gpus+=("$2") ;;
  *) fail arguments "a known argument" "$1" ;;
  esac
  shift 2
done

case "$cpu_vendor" in
intel | amd) ;;
*) fail arguments "--cpu-vendor intel or amd" "'$cpu_vendor'" ;;
esac
case "$reboot_policy" in
when-idle | always | never) ;;
*) fail arguments "--reboot-policy when-idle, always or never" "'$reboot_policy'" ;;
esac
[[ ${#gpus[@]} -gt 0 ]] || fail arguments "at least one --gpu" "none"

wanted_args=("${cpu_vendor}_iommu=on" "iommu=pt")
[[ "$acs_override" != 1 ]] || wanted_args+=("pcie_acs_override=downstream,multifunction")

# put_file <file> <content>: atomically (a temporary file in the same directory, fsync, rename, fsync of the
# directory), so a killed or failing write leaves the old file or the new one, never a truncated one. ENOSPC or a
# read-only file system fail the step naming the file.
put_file() {
  local file="$1" content="$2" dir="${1%/*}" tmp err
  [[ -d "$dir" ]] || err="$(mkdir -p "$dir" 2>&1)" || fail write "directory ${dir#"$ROOT"}" "${err:-mkdir failing}"
  tmp="$(mktemp "$file.pgc-XXXXXX" 2>&1)" || fail write "a temporary file next to ${file#"$ROOT"}" "$tmp"
  if ! err="$({
    printf '%s\n' "$content" >"$tmp" && chmod 0644 "$tmp" && sync "$tmp" && mv -f "$tmp" "$file" && sync "$dir"
  } 2>&1)"; then
    rm -f "$tmp"
    fail write "${file#"$ROOT"} written" "${err:-an error}"
  fi
}

# mark <name>: the pending marker of a regeneration (empty, so creating it is atomic), made durable at once.
mark() {
  local err
  [[ ! -e "$STATE/$1-pending" ]] || return 0
  err="$({ mkdir -p "$STATE" && : >"$STATE/$1-pending" && sync "$STATE/$1-pending" "$STATE"; } 2>&1)" ||
    fail write "${STATE#"$ROOT"}/$1-pending written" "${err:-an error}"
}

# differs <file> <content>: whether the file is missing or holds something else.
differs() {
  [[ ! -f "$1" ]] || [[ "$(<"$1")" != "$2" ]]
}

# put <file> <content>: write it when it differs (leftover temporary files of a killed run go first); remember it.
put() {
  local file="$1" content="$2"
  rm -f "$file".pgc-*
  differs "$file" "$content" || return 0
  put_file "$file" "$content"
  changed+=("${file#"$ROOT"}")
}

# Merge the wanted arguments into a kernel command line: an argument with the same key is replaced,
# everything else is kept in order, nothing is duplicated.
merge_args() {
  local token keys=" " out=() tokens=()
  for token in "${wanted_args[@]}"; do
    keys+="${token%%=*} "
  done
  read -r -a tokens <<<"$1" || true
  for token in "${tokens[@]}"; do
    [[ "$keys" == *" ${token%%=*} "* ]] || out+=("$token")
  done
  out+=("${wanted_args[@]}")
  echo "${out[*]}"
}

detect_boot_loader() {
  # proxmox-boot-tool keeps the ESP list in /etc/kernel/proxmox-boot-uuids; with /etc/kernel/cmdline present
  # the node boots with systemd-boot (ZFS root on UEFI), otherwise with GRUB (Proxmox VE admin guide, "Host
  # Bootloader").
  if [[ -f "$ROOT/etc/kernel/proxmox-boot-uuids" && -f "$ROOT/etc/kernel/cmdline" ]]; then
    echo systemd-boot
  else
    echo grub
  fi
}

# regenerate <name> <command...>: rebuild what boots from the files. The pending marker is written first and
# removed only after the tool succeeded, so a run that fails or is cut off in between is redone by the next one.
# The tool's output goes to stderr (stdout is the step's report); on failure it follows the step's line.
regenerate() {
  local name="$1" out rc=0
  shift
  mark "$name"
  out="$("$@" 2>&1)" || rc=$?
  if ((rc)); then
    echo "host-prep: $name: expected '$*' to exit 0, saw exit $rc (the next run redoes it; its output follows)" >&2
    printf '%s\n' "$out" >&2
    exit 1
  fi
  [[ -z "$out" ]] || printf '%s\n' "$out" >&2
}

# has_args <command line>: whether it holds every wanted argument; the missing ones in $missing.
has_args() {
  local token
  missing=()
  for token in "${wanted_args[@]}"; do
    [[ " $1 " == *" $token "* ]] || missing+=("$token")
  done
  ((${#missing[@]} == 0))
}

# grub_generated: the default entry's kernel line in the generated grub.cfg (its first "linux" line), normalised.
grub_generated() {
  local line words
  line="$(sed -n 's/^[[:space:]]*linux[[:space:]]\+//p' "$ROOT/boot/grub/grub.cfg" 2>/dev/null | head -n 1 || true)"
  read -r -a words <<<"$line" || true # normalises the spaces grub-mkconfig leaves
  echo "${words[*]}"
}

# initramfs_fingerprint: of the module files this step manages, as the initramfs should pack them.
initramfs_fingerprint() {
  cat "${initramfs_files[@]}" 2>/dev/null | sha256sum | cut -d' ' -f1
}

# bound_driver <sysfs device>: the driver bound to it, or nothing.
bound_driver() {
  if [[ -L "$1/driver" ]]; then basename "$(readlink "$1/driver")"; fi
}

# sysfs_write <value> <file>: bounded (an unbind can hang on a busy device). --foreground keeps tee in the step's
# process group, so whatever ends the step (a dropped SSH session) ends the write too.
sysfs_write() {
  printf '%s' "$1" | timeout --foreground 30 tee "$2" >/dev/null 2>&1
}

# bind_vfio <function address>: hand one PCI function to vfio-pci now (driver_override, unbind, probe). Each write
# is decided from the live binding, so a binding cut short anywhere is finished by the next run.
bind_vfio() {
  local dev="$ROOT/sys/bus/pci/devices/$1" current
  current="$(bound_driver "$dev")"
  [[ "$current" == vfio-pci ]] && return 0
  [[ "$(cat "$dev/driver_override" 2>/dev/null || true)" == vfio-pci ]] ||
    sysfs_write vfio-pci "$dev/driver_override" || return 1
  [[ -z "$current" ]] || sysfs_write "$1" "$dev/driver/unbind" || return 1
  sysfs_write "$1" "$ROOT/sys/bus/pci/drivers_probe" || true # the probe's status is what the link shows
  [[ "$(bound_driver "$dev")" == vfio-pci ]] || return 1
  echo "vfio: $1 bound to vfio-pci (was ${current:-unbound})"
}

# running_guests: "VM <id> (<name>), CT <id> (<name>)" for every running guest on this node, ours or not;
# fails when the lists cannot be read.
running_guests() {
  local vms cts=""
  vms="$(qm list)" || return 1
  ! command -v pct >/dev/null || cts="$(pct list)" || return 1
  {
    awk 'NR > 1 && $3 == "running" { print "VM " $1 " (" $2 ")" }' <<<"$vms"
    # pct list's Lock column may be empty: the name is the last field.
    awk 'NR > 1 && $2 == "running" { print "CT " $1 " (" $NF ")" }' <<<"$cts"
  } | paste -sd, - | sed 's/,/, /g'
}

main() {
  local current merged boot_file boot_content refresh_boot=() functions=() ids=() fn slot expected id found
  local id_list gpu file running boot_id unbound=() reason guests="" generated
  local scheduled_boot="" scheduled_reason="" scheduled_config=""
  local -a missing=() initramfs_files
  local -A content=()
  host_lock host-prep # host_lib.sh
  [[ "$boot_loader" != auto ]] || boot_loader="$(detect_boot_loader)"

  case "$boot_loader" in
  grub)
    boot_file="$ROOT/etc/default/grub"
    [[ -f "$boot_file" ]] || fail kernel-args "${boot_file#"$ROOT"}" "no such file"
    current="$(sed -n 's/^GRUB_CMDLINE_LINUX_DEFAULT="\(.*\)"$/\1/p' "$boot_file" | tail -n 1)"
    merged="$(merge_args "$current")"
    if grep -q '^GRUB_CMDLINE_LINUX_DEFAULT=' "$boot_file"; then
      boot_content="$(awk -v line="GRUB_CMDLINE_LINUX_DEFAULT=\"$merged\"" \
        '/^GRUB_CMDLINE_LINUX_DEFAULT=/ { if (!done) print line; done = 1; next } { print }' "$boot_file")"
    else
      boot_content="$(cat "$boot_file")"$'\n'"GRUB_CMDLINE_LINUX_DEFAULT=\"$merged\""
    fi
    refresh_boot=(update-grub)
    ;;
  systemd-boot)
    boot_file="$ROOT/etc/kernel/cmdline"
    [[ -f "$boot_file" ]] || fail kernel-args "${boot_file#"$ROOT"}" "no such file"
    boot_content="$(merge_args "$(head -n 1 "$boot_file")")"
    refresh_boot=(proxmox-boot-tool refresh)
    ;;
  *) fail arguments "--boot-loader grub, systemd-boot or auto" "'$boot_loader'" ;;
  esac

  # vendor:device of every function of every declared GPU (the GPU and e.g. its audio or USB-C functions).
  for gpu in "${gpus[@]}"; do
    slot="${gpu%%=*}"
    expected="${gpu#*=}"
    found=0
    for fn in "$ROOT/sys/bus/pci/devices/$slot".*; do
      [[ -e "$fn/vendor" ]] || continue
      id="$(sed 's/^0x//' "$fn/vendor"):$(sed 's/^0x//' "$fn/device")"
      if [[ "${fn##*/}" == "$slot.0" ]]; then
        found=1
        [[ "$id" == "$expected" ]] || fail vfio-ids "$expected at $slot.0 (the spec's model)" "$id"
      fi
      ids+=("$id")
      functions+=("${fn##*/}")
    done
    ((found)) || fail vfio-ids "a PCI device at $slot.0" "none"
  done
  id_list="$(printf '%s\n' "${ids[@]}" | sort -u | paste -sd, -)"

  # vfio_virqfd is not listed: it is built into vfio since kernel 6.2 (Proxmox VE 8).
  content["$ROOT/etc/modules-load.d/vfio.conf"]="# Managed by proxmox-gpu-cluster
vfio
vfio_iommu_type1
vfio_pci"
  content["$ROOT/etc/modprobe.d/blacklist-gpu-passthrough.conf"]="# Managed by proxmox-gpu-cluster: host drivers must \
not claim passthrough GPUs
blacklist nouveau
blacklist nvidia
blacklist nvidiafb
blacklist nvidia_drm"
  # softdep makes modprobe load vfio-pci before any GPU driver, so vfio-pci binds the ids first.
  content["$ROOT/etc/modprobe.d/vfio.conf"]="# Managed by proxmox-gpu-cluster
options vfio-pci ids=$id_list
softdep nouveau pre: vfio-pci
softdep nvidia pre: vfio-pci
softdep nvidiafb pre: vfio-pci
softdep nvidia_drm pre: vfio-pci
softdep snd_hda_intel pre: vfio-pci"
  initramfs_files=("$ROOT/etc/modules-load.d/vfio.conf" "$ROOT/etc/modprobe.d/blacklist-gpu-passthrough.conf"
    "$ROOT/etc/modprobe.d/vfio.conf")

  # The pending markers go first, so a run cut off after a file changed redoes the regeneration it needs.
  ! differs "$boot_file" "$boot_content" || mark boot-loader
  for file in "${initramfs_files[@]}"; do
    ! differs "$file" "${content[$file]}" || mark initramfs
  done
  put "$boot_file" "$boot_content"
  for file in "${initramfs_files[@]}"; do
    put "$file" "${content[$file]}"
  done
  for file in "${changed[@]}"; do
    echo "changed: $file"
  done

  # Module and modprobe files take effect through the initramfs (on systemd-boot nodes Proxmox's initramfs hook
  # copies the new image to the ESPs): rebuilt when pending or when it was built from other files.
  if [[ -e "$STATE/initramfs-pending" ]] ||
    [[ "$(cat "$STATE/initramfs-generated" 2>/dev/null || true)" != "$(initramfs_fingerprint)" ]]; then
    regenerate initramfs update-initramfs -u -k all
    put_file "$STATE/initramfs-generated" "$(initramfs_fingerprint)"
    rm -f "$STATE/initramfs-pending"
  fi

  # Kernel arguments take effect through the boot loader's generated configuration.
  if [[ "$boot_loader" == grub ]]; then
    if [[ -e "$STATE/boot-loader-pending" ]] || ! has_args "$(grub_generated)"; then
      regenerate boot-loader update-grub
      generated="$(grub_generated)"
      # A file in /etc/default/grub.d may set the variable again: then no reboot could ever help.
      has_args "$generated" || fail boot-config "${missing[*]} in the first linux line of /boot/grub/grub.cfg after \
update-grub" "'$generated' (does a file in /etc/default/grub.d set GRUB_CMDLINE_LINUX_DEFAULT?)"
      rm -f "$STATE/boot-loader-pending"
    fi
  elif [[ -e "$STATE/boot-loader-pending" ]] ||
    [[ "$(cat "$STATE/kernel-cmdline-refreshed" 2>/dev/null || true)" != "$(cat "$boot_file")" ]]; then
    regenerate boot-loader proxmox-boot-tool refresh
    put_file "$STATE/kernel-cmdline-refreshed" "$(cat "$boot_file")"
    rm -f "$STATE/boot-loader-pending"
  fi

  # A reboot is due only when the running kernel lacks an argument, or a GPU cannot be bound at runtime.
  running="$(cat "$ROOT/proc/cmdline")"
  boot_id="$(cat "$ROOT/proc/sys/kernel/random/boot_id" 2>/dev/null || true)"
  if has_args "$running"; then
    # The IOMMU is on: newly declared GPUs go to vfio-pci now instead of at the next boot.
    [[ -d "$ROOT/sys/module/vfio_pci" ]] || modprobe vfio-pci || fail vfio "modprobe vfio-pci to exit 0" "a failure"
    for fn in "${functions[@]}"; do
      bind_vfio "$fn" || unbound+=("$fn")
    done
  fi
  if ((${#missing[@]})); then
    reason="the running kernel lacks ${missing[*]}"
  elif ((${#unbound[@]})); then
    reason="${unbound[*]} could not be bound to vfio-pci at runtime"
  else
    rm -f "$MARKER" "$SCHEDULED"
    echo "reboot: not-needed"
    return 0
  fi

  # A reboot this step scheduled for this reason in another boot did not bring what it was for: with the same
  # generated boot configuration, another would bring the same (a different one, say the cause was fixed, may).
  generated="$boot_loader: $(grub_generated)"
  [[ "$boot_loader" == grub ]] || generated="$boot_loader: $(cat "$STATE/kernel-cmdline-refreshed")"
  if [[ -f "$SCHEDULED" ]]; then
    { read -r scheduled_boot scheduled_reason && read -r scheduled_config; } <"$SCHEDULED" || true
  fi
  if [[ -n "$scheduled_boot" && "$scheduled_boot" != "$boot_id" && "$scheduled_reason" == "$reason" &&
    "$scheduled_config" == "$generated" ]]; then
    if ((${#missing[@]})); then
      fail reboot "${missing[*]} in /proc/cmdline after the reboot host prep scheduled (boot $scheduled_boot)" \
        "'$running'; not rebooting again: the node booted something other than what ${refresh_boot[*]} generated \
(is --boot-loader $boot_loader the one it boots with?); fix that and reboot it yourself, or delete \
${SCHEDULED#"$ROOT"} to let host prep reboot it again"
    fi
    fail reboot "${unbound[*]} bound to vfio-pci after the reboot host prep scheduled (boot $scheduled_boot)" \
      "them unbound; not rebooting again: check what claims them, reboot it yourself or delete ${SCHEDULED#"$ROOT"}"
  fi

  put_file "$MARKER" "$reason"
  if [[ "$reboot_policy" == never ]]; then
    echo "reboot: required ($reason; rebootPolicy never: reboot the node yourself, then run pulumi up again)"
    return 0
  fi
  if ! guests="$(running_guests)"; then
    [[ "$reboot_policy" == always ]] ||
      fail reboot "the node's guests listed before rebooting it ($reason)" "qm list failing; not rebooting"
    guests="unknown (qm list failed)"
  fi
  if [[ "$reboot_policy" == when-idle && -n "$guests" ]]; then
    fail reboot "no running guests before rebooting the node ($reason)" "$guests; stop them, or set rebootPolicy: \
always (or never, and reboot it yourself). The configuration is written; the next run continues from here"
  fi
  # Recorded before it is scheduled: a run cut off in between finds the same boot id and schedules it again.
  put_file "$SCHEDULED" "$boot_id $reason"$'\n'"$generated"
  # Reboot a few seconds after this command returns, so the SSH session ends cleanly first.
  systemd-run --on-active=5 systemctl reboot >&2
  echo "reboot: scheduled ($reason${guests:+; running guests go down with it: $guests})"
}

main "$@" </dev/null
