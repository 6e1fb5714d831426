#!/usr/bin/env bash
# Host prep's composition (bundled between host_lib.sh and host_prep.sh, render/agent_bundle.py): the claims of
# every owner of this node, merged into what is host-wide, and the kernel command line merged with what they want.
#
# Several stacks, or several clusters of one program, may pass GPUs of one Proxmox node through. What host prep
# writes is host-wide (vfio.conf's function list, the blacklist, the kernel command line): if each owner's run wrote
# it from its own GPUs only, each would unbind the other's at the next boot. So each owner (a scope token such as
# prod-1a2b3c4d) keeps its declaration in its own drop-in, $CLAIMS/<owner>.conf, and every run writes the host-wide
# files from the union of all drop-ins. Format (see host_prep.sh): data only, parsed strictly.
set -euo pipefail

CLAIMS="${PGC_ROOT:-}/etc/proxmox-gpu-cluster/host-prep.d"
OWNER_RE='^[a-z0-9][a-z0-9-]{0,62}$'
GPU_RE='^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})=([0-9a-f]{4}:[0-9a-f]{4})$'
# The union (compose_claims): GPUs as <slot>=<vendor:device> in a fixed order (owners by name, then each owner's
# own order), so whichever owner runs writes the same files; with one owner, its own order (the files an earlier
# version wrote from the same arguments, byte for byte). Each slot's vendor:device and owners. The kernel arguments
# any owner wants, in a fixed order, in wanted_args (intel_iommu=on joins them in host_prep.sh, from the running
# kernel); unwanted_args are removed wherever found: amd_iommu=on is no value of amd_iommu= (an earlier version wrote
# it).
union_gpus=() wanted_args=() unwanted_args=("amd_iommu=on")
declare -A slot_id=() slot_owners=()

# declaration <owner> <iommu-pt> <acs-override> <gpu...>: the drop-in text of one owner.
declaration() {
  local gpu
  echo "# proxmox-gpu-cluster host prep: what owner $1 passes through on this node (data: see host_prep.sh)"
  for gpu in "${@:4}"; do echo "gpu $gpu"; done
  echo "iommu-pt $2"
  echo "acs-override $3"
}

# add_claim <file> <owner> <text>: one owner's declaration joins the union; a malformed one fails naming its file,
# a slot another owner declared with another vendor:device fails naming both.
add_claim() {
  local file="${1#"${PGC_ROOT:-}"}" owner="$2" line key value pt="" acs="" count=0 slot id
  local format="lines 'gpu <domain:bus:device>=<vendor:device>', 'iommu-pt 0|1', 'acs-override 0|1' or '# ...'"
  while IFS= read -r line; do
    [[ -n "$line" && "$line" != \#* ]] || continue
    key="${line%% *}" value="${line#* }"
    case "$key" in
    gpu)
      [[ "$value" =~ $GPU_RE ]] || fail claims "$format in $file" "'$line'"
      slot="${BASH_REMATCH[1]}" id="${BASH_REMATCH[2]}"
      count=$((count + 1))
      if [[ ! -v "slot_id[$slot]" ]]; then
        slot_id[$slot]="$id" slot_owners[$slot]="$owner"
        union_gpus+=("$slot=$id")
      elif [[ "${slot_id[$slot]}" != "$id" ]]; then
        fail gpu-claims "one vendor:device for GPU $slot on this node" "${slot_id[$slot]} declared by owner \
${slot_owners[$slot]%% *} and $id by owner $owner; remove it from one of them"
      elif [[ " ${slot_owners[$slot]} " != *" $owner "* ]]; then
        slot_owners[$slot]+=" $owner" # the same GPU declared by two owners: shared
      fi
      ;;
    iommu-pt)
      [[ "$value" == [01] && -z "$pt" ]] || fail claims "$format, iommu-pt once, in $file" "'$line'"
      pt="$value"
      ;;
    acs-override)
      [[ "$value" == [01] && -z "$acs" ]] || fail claims "$format, acs-override once, in $file" "'$line'"
      acs="$value"
      ;;
    *) fail claims "$format in $file" "'$line'" ;;
    esac
  done <<<"$3"
  [[ -n "$pt" && -n "$acs" ]] || fail claims "an iommu-pt and an acs-override line in $file" "${pt:-no iommu-pt} \
${acs:-no acs-override}"
  ((count)) || fail claims "at least one gpu line in $file" "none"
  ((pt == 0)) || any_pt=1
  ((acs == 0)) || any_acs=1
}

# compose_claims <owner> <text>: the union of every drop-in, with <text> standing for <owner>'s own (the drop-in
# this run is about to write: a declaration that cannot join the union is refused before it is recorded).
compose_claims() {
  local file name text any_pt=0 any_acs=0
  while IFS= read -r name; do
    [[ "$name" =~ $OWNER_RE ]] || fail claims "drop-ins named <owner>.conf, owner like $OWNER_RE, in \
${CLAIMS#"${PGC_ROOT:-}"}" "'$name.conf'"
    if [[ "$name" == "$1" ]]; then
      text="$2"
    else
      text="$(cat "$CLAIMS/$name.conf")" || fail claims "${CLAIMS#"${PGC_ROOT:-}"}/$name.conf readable" "an error"
    fi
    add_claim "$CLAIMS/$name.conf" "$name" "$text"
  done < <({
    for file in "$CLAIMS"/*.conf; do
      [[ ! -e "$file" ]] || { file="${file##*/}" && echo "${file%.conf}"; }
    done
    echo "$1"
  } | LC_ALL=C sort -u)
  wanted_args=()
  ((!any_pt)) || wanted_args+=("iommu=pt")
  ((!any_acs)) || wanted_args+=("pcie_acs_override=downstream,multifunction")
}

# compose_functions: every PCI function of every GPU in the union (the GPU and e.g. its audio or USB-C functions),
# by address, in $functions; the NVIDIA display functions (class 0x03xxxx; a console GPU) no owner declares, which
# need their host driver (so no blacklist), in $others.
compose_functions() {
  local gpu slot expected found fn id vendor class
  for gpu in "${union_gpus[@]}"; do
    slot="${gpu%%=*}"
    expected="${gpu#*=}"
    found=0
    for fn in "$ROOT/sys/bus/pci/devices/$slot".*; do
      [[ -e "$fn/vendor" ]] || continue
      if [[ "${fn##*/}" == "$slot.0" ]]; then
        found=1
        id="$(sed 's/^0x//' "$fn/vendor"):$(sed 's/^0x//' "$fn/device")"
        [[ "$id" == "$expected" ]] ||
          fail vfio-ids "$expected at $slot.0 (the model owner ${slot_owners[$slot]// / and } declares)" "$id"
      fi
      functions+=("${fn##*/}")
    done
    ((found)) || fail vfio-ids "a PCI device at $slot.0 (declared by owner ${slot_owners[$slot]// / and })" "none"
  done
  for fn in "$ROOT"/sys/bus/pci/devices/*; do
    vendor="$(cat "$fn/vendor" 2>/dev/null || true)"
    class="$(cat "$fn/class" 2>/dev/null || true)"
    [[ "$vendor" == 0x10de && "$class" == 0x03* && " ${functions[*]} " != *" ${fn##*/} "* ]] || continue
    others+=("${fn##*/}")
  done
}

# Merge the wanted arguments into a kernel command line: one already there stays where it is, one with the same
# key (iommu=soft for iommu=pt) is replaced in place, the others are appended; unwanted ones go; everything else is
# kept in order; nothing is duplicated. So a line that already holds what is wanted comes out unchanged.
merge_args() {
  local token want found out=() tokens=() placed=" "
  read -r -a tokens <<<"$1" || true
  for token in "${tokens[@]}"; do
    [[ " ${unwanted_args[*]} " != *" $token "* ]] || continue
    found=""
    for want in ${wanted_args[@]+"${wanted_args[@]}"}; do
      [[ "${want%%=*}" != "${token%%=*}" ]] || found="$want"
    done
    if [[ -z "$found" ]]; then
      out+=("$token")
    elif [[ "$placed" != *" $found "* ]]; then
      out+=("$found")
      placed+="$found "
    fi
  done
  for want in ${wanted_args[@]+"${wanted_args[@]}"}; do
    [[ "$placed" == *" $want "* ]] || out+=("$want")
  done
  echo "${out[*]}"
}

# has_args <command line>: whether it holds every wanted argument; the missing ones in $missing.
has_args() {
  local token
  missing=()
  for token in ${wanted_args[@]+"${wanted_args[@]}"}; do
    [[ " $1 " == *" $token "* ]] || missing+=("$token")
  done
  ((${#missing[@]} == 0))
}

# The boot configuration: which file holds the kernel command line (boot_loader: grub, /etc/default/grub; systemd-boot,
# /etc/kernel/cmdline) and whether proxmox-boot-tool regenerates the boot from it (esp_sync=1) or update-grub does.
#
# proxmox-boot-tool (proxmox-kernel-helper) keeps the kernels of a ZFS or BTRFS root on the ESPs listed in
# /etc/kernel/proxmox-boot-uuids. The installer sets it up on every such root, with GRUB on legacy BIOS and with
# Secure Boot and systemd-boot on UEFI without it (pve-installer Proxmox/Install.pm; pve-docs system-booting.adoc,
# "Host Bootloader"). Its refresh decides per ESP by what `init` put there (zz-proxmox-boot, update_esp_func): GRUB
# when the ESP holds EFI/proxmox/grubx64.efi (`init <partition> grub`) or the node booted without UEFI (no
# /sys/firmware/efi); it then runs update-grub with the ESP as /boot, so the arguments come from /etc/default/grub
# and /etc/kernel/cmdline is ignored. Otherwise systemd-boot, whose loader entries take /etc/kernel/cmdline. So the
# ESP list alone says nothing about the boot loader; `proxmox-boot-tool status` does (pve-docs system-booting.adoc,
# "Determine which Bootloader is Used"; bin/proxmox-boot-tool status, _status_detail): "System currently booted with
# uefi" or "... legacy bios" (/sys/firmware/efi), then per ESP "<uuid> is configured with: uefi (versions: ...)"
# (loader/loader.conf) and/or "grub (versions: ...)" (a grub directory).
# secure_boot: whether the firmware runs with Secure Boot on: the SecureBoot EFI variable (efivarfs: four bytes of
# attributes, then the value; Documentation/filesystems/efivarfs.rst), 1 when on.
secure_boot() {
  local var="$ROOT/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
  [[ -r "$var" && "$(od -An -tu1 -j4 -N1 "$var" | tr -d ' ')" == 1 ]]
}

# detect_boot_loader: sets esp_sync from the ESP list, and boot_loader when it is "auto" (an explicit one is the
# operator's word): GRUB without proxmox-boot-tool, else what `proxmox-boot-tool status` says every ESP uses. An ESP
# with both a loader.conf and a grub directory boots GRUB only if it holds grubx64.efi, which status does not show:
# with Secure Boot on it must (systemd-boot does not start: pve-docs, "Secure Boot"), otherwise it is ambiguous.
detect_boot_loader() {
  local status line uefi="" config mode="" found=() modes=" " rc=0
  [[ -e "$ROOT/etc/kernel/proxmox-boot-uuids" ]] || { [[ "$boot_loader" != auto ]] || boot_loader=grub; return 0; }
  # shellcheck disable=SC2034 # read by host_prep.sh
  esp_sync=1
  [[ "$boot_loader" == auto ]] || return 0
  status="$(proxmox-boot-tool status 2>&1)" || rc=$?
  ((!rc)) || fail boot-loader "'proxmox-boot-tool status' to exit 0 (/etc/kernel/proxmox-boot-uuids exists)" \
    "exit $rc: $(tail -n 1 <<<"$status")"
  while IFS= read -r line; do
    case "$line" in
    "System currently booted with uefi") uefi=1 ;;
    "System currently booted with legacy bios") uefi=0 ;;
    *" is configured with: "*)
      config="${line#* is configured with: }" mode=none
      if [[ "$config" =~ (^|, )grub\ \( && ( "$uefi" == 0 || ! "$config" =~ ^uefi\ \( ) ]]; then
        mode=grub
      elif [[ "$uefi" == 1 && "$config" =~ ^uefi\ \( ]]; then
        mode=systemd-boot
        [[ ! "$config" =~ (^|, )grub\ \( ]] || if secure_boot; then mode=grub; else mode=ambiguous; fi
      fi
      found+=("${line%% is configured with: *}: $mode") modes+="$mode "
      ;;
    esac
  done <<<"$status"
  mode="${found[0]:-}" && mode="${mode#*: }"
  [[ -n "$uefi" && ("$mode" == grub || "$mode" == systemd-boot) && "${modes// $mode/}" == " " ]] ||
    fail boot-loader "every ESP in 'proxmox-boot-tool status' set up for one boot loader (or bootLoader set)" \
      "firmware ${uefi:-unknown} (1: uefi, 0: bios), ESPs '${found[*]:-none}'"
  boot_loader="$mode"
}

# grub_generated: the default entry's kernel line in the generated /boot/grub/grub.cfg (its first "linux" line),
# normalised.
grub_generated() {
  local line words
  line="$(sed -n 's/^[[:space:]]*linux[[:space:]]\+//p' "$ROOT/boot/grub/grub.cfg" 2>/dev/null | head -n 1 || true)"
  read -r -a words <<<"$line" || true # normalises the spaces grub-mkconfig leaves
  echo "${words[*]}"
}

# grub_configured: the arguments GRUB's configuration gives the default entry, read as grub-mkconfig reads it
# (grub2-common 2.06 /usr/sbin/grub-mkconfig sources /etc/default/grub, then every /etc/default/grub.d/*.cfg, so a
# later file wins; /etc/grub.d/10_linux puts GRUB_CMDLINE_LINUX then GRUB_CMDLINE_LINUX_DEFAULT on it). For
# proxmox-boot-tool's GRUB, whose grub.cfg is on the ESPs (not mounted): what their refresh generates from.
grub_configured() {
  (
    trap - ERR
    set +eu
    GRUB_CMDLINE_LINUX="" GRUB_CMDLINE_LINUX_DEFAULT=""
    # shellcheck disable=SC1091 # the node's own configuration
    . "$ROOT/etc/default/grub" >/dev/null 2>&1
    for cfg in "$ROOT"/etc/default/grub.d/*.cfg; do
      # shellcheck disable=SC1090
      [[ ! -e "$cfg" ]] || . "$cfg" >/dev/null 2>&1
    done
    read -r -a words <<<"$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT" || true
    echo "${words[*]}"
  )
}

# with_vfio_modules <file>: the initramfs-tools module list with this project's block (vfio-pci and what it needs)
# at its end, the node's other lines as they are.
with_vfio_modules() {
  local kept
  kept="$(sed '/^# >>> proxmox-gpu-cluster/,/^# <<< proxmox-gpu-cluster/d' "$1" 2>/dev/null || true)"
  printf '%s# >>> proxmox-gpu-cluster: vfio-pci in the initramfs (host prep)\nvfio\nvfio_iommu_type1\nvfio_pci\n%s' \
    "${kept:+$kept$'\n'}" "# <<< proxmox-gpu-cluster"
}
