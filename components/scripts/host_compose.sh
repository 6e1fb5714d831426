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
