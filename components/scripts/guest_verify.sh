#!/usr/bin/env bash
# Step 5 of the guest bootstrap, the gate before the GPU stack: the host sees exactly the GPUs assigned to it on
# the PCI bus and (host driver) in nvidia-smi, and the running containerd has the nvidia runtime (host toolkit).
# Changes nothing on the host. Sent after guest_lib.sh and guest_rollout.sh.
#
# KubeVirt nodes: the GPUs on vfio-pci (vm-passthrough), the kernel booted with the IOMMU arguments and IOMMU
# groups present, and /dev/kvm (a VM worker needs nested virtualization from its Proxmox node). A vm-vgpu node
# (--kernel-below 6.0) must run a kernel older than that: the GPU Operator's KubeVirt vGPU path uses mediated devices,
# which NVIDIA supports below kernel 6.0 only (on 6.8 the vGPU Manager uses the vendor-specific VFIO framework on
# SR-IOV GPUs and no mdev device appears; components/core/vgpu.py has the sources).
#
# Usage: guest_verify.sh --gpu VENDOR:DEVICE=PRODUCT [--gpu ...] [--nvidia-smi 0|1] [--driver VERSION|BRANCH]
#                        [--containerd-nvidia 0|1] [--vfio 0|1] [--kvm 0|1] [--kernel-arg ARG ...]
#                        [--kernel-below MAJOR.MINOR] [--kubernetes MINOR] [--cpus N] [--memory-mib MIB]
#                        [--after KEY] [--rollout 1 --rollout-node NAME --rollout-api HOST:PORT ...] (guest_rollout.sh)
# A node the driver step cordoned for a rolling change (guest_rollout.sh) is uncordoned once it passed and its slot
# given back; when it fails, the slot is given back and the node stays cordoned.
# --after: a key of the commands of the steps before it that may cordon the node (driver, join, VM restart), so that
# this step runs again whenever one of them does, and uncordons what it cordoned (only that: it is not read).
# --kubernetes: the kubelet package of that minor is installed (after the join step's install or upgrade).
# --cpus, --memory-mib: the VM runs on what its spec asks (after a VM restart applied pending hardware): that many
# processors, and a MemTotal between 70% and 100% of the RAM (the kernel and firmware keep some; a crash kernel's
# reservation up to 30%; no ballooning on passthrough VMs, worker_vm.py).
# PRODUCT is the NVML name with spaces as dashes (NVIDIA-A10). Prints "verify: driver: <version>" (host driver)
# and "verify: ok: ..." or fails naming what was expected and what was seen.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="verify"

gpus=() nvidia_smi=0 driver="" containerd_nvidia=0 vfio=0 kvm=0 kernel_args=() kernel_below="" kubernetes="" cpus="" memory_mib=""
while (($#)); do
  case "$1" in
  --vfio) vfio="$2" ;;
  --kvm) kvm="$2" ;;
  --kernel-arg) kernel_args+=("$2") ;;
  --kernel-below) kernel_below="$2" ;;
  --gpu) gpus+=("$2") ;;
  --nvidia-smi) nvidia_smi="$2" ;;
  --driver) driver="$2" ;;
  --kubernetes) kubernetes="$2" ;;
  --cpus) cpus="$2" ;;
  --memory-mib) memory_mib="$2" ;;
  --containerd-nvidia) containerd_nvidia="$2" ;;
  --after) [[ "$2" =~ ^[0-9a-f]{16}$ ]] || fail "--after" "a 16-digit hex key" "'${2:0:40}'" ;;
  *) rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
rollout_check_args
[[ -z "$kubernetes" || "$kubernetes" =~ ^[0-9]{2}$ ]] || fail "--kubernetes" "a two-digit minor version" "'$kubernetes'"
[[ -z "$cpus" || "$cpus" =~ ^[1-9][0-9]{0,3}$ ]] || fail "--cpus" "a count" "'$cpus'"
[[ -z "$memory_mib" || "$memory_mib" =~ ^[1-9][0-9]{0,8}$ ]] || fail "--memory-mib" "MiB" "'$memory_mib'"
((${#gpus[@]})) || fail "arguments" "at least one --gpu" "none"
# The flags reach (( )) below, which evaluates its operand as arithmetic (an array index in it runs command
# substitutions): only 0 or 1 passes.
[[ "$vfio$kvm$nvidia_smi$containerd_nvidia" =~ ^[01]{4}$ ]] ||
  fail "arguments" "0 or 1 for --vfio, --kvm, --nvidia-smi and --containerd-nvidia" \
    "'$vfio' '$kvm' '$nvidia_smi' '$containerd_nvidia'"

# How many GPUs of each vendor:device id the host must have.
declare -A want=()
for gpu in "${gpus[@]}"; do
  id="${gpu%%=*}"
  want[$id]=$((${want[$id]:-0} + 1))
done

check_pci() {
  local id seen
  for id in "${!want[@]}"; do
    seen="$(lspci -nn | grep -ciF "[$id]" || true)"
    if [[ "$seen" != "${want[$id]}" ]]; then
      fail "lspci -nn" "${want[$id]} x $id" "$seen"
    fi
  done
}

check_nvidia_smi() {
  local listing names expected version
  local rc=0
  listing="$(nvidia-smi -L 2>&1)" || rc=$?
  # The first line says what failed (NVML's "Driver/library version mismatch" after a driver change without its
  # reboot); the whole output follows.
  ((rc == 0)) || fail_output "$listing" "nvidia-smi -L" "${#gpus[@]} GPU(s)" "$rc"
  # "GPU 0: NVIDIA A10 (UUID: GPU-...)"; MIG devices are listed indented below their GPU and are not counted.
  names="$(sed -nE 's/^GPU [0-9]+: (.*) \(UUID: .*\)$/\1/p' <<<"$listing" | tr ' ' '-' | sort | paste -sd, -)"
  expected="$(printf '%s\n' "${gpus[@]#*=}" | sort | paste -sd, -)"
  [[ "$names" == "$expected" ]] || fail "nvidia-smi -L" "$expected" "${names:-no GPU}"
  version="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
  if [[ -n "$driver" ]]; then
    [[ "$version" == "$driver" || "$version" == "$driver".* ]] || fail "driver version" "$driver" "$version"
  fi
  # The build that runs, for the stack's outputs: with only a branch pinned, nodes set up at different times
  # may run different builds of it.
  echo "verify: driver: $version"
}

# check_containerd: the RUNNING containerd (crictl info: the CRI config the daemon loaded, not the files, which a
# restart that never happened would leave unapplied) has the nvidia runtime and runc with the systemd cgroup driver.
check_containerd() {
  local info runtimes rc=0
  info="$(crictl --runtime-endpoint unix:///run/containerd/containerd.sock info 2>&1)" || rc=$?
  ((rc == 0)) || fail_output "$info" "crictl info" "the running containerd's config" "$rc"
  runtimes="$(python3 -c '
import json, sys
c = json.load(sys.stdin)["config"]["containerd"]
print(",".join(sorted(c["runtimes"])), c["runtimes"].get("runc", {}).get("options", {}).get("SystemdCgroup", False))
' <<<"$info")" || fail "crictl info" "JSON with the CRI config" "something else"
  grep -qxF nvidia <<<"$(tr ',' '\n' <<<"${runtimes% *}")" ||
    fail "containerd running config (crictl info)" "an nvidia runtime" "${runtimes% *}"
  [[ "${runtimes##* }" == True ]] ||
    fail "containerd running config (crictl info)" "runc with SystemdCgroup = true" "SystemdCgroup = ${runtimes##* }"
}

check_vfio() {
  local id dev driver bound drivers
  for id in "${!want[@]}"; do
    bound=0 drivers=()
    while read -r dev; do
      [[ -n "$dev" ]] || continue
      driver="$(bound_driver "$dev")"
      drivers+=("${driver:-none}")
      [[ "$driver" == vfio-pci ]] && bound=$((bound + 1))
    done < <(pci_devices "$id")
    ((bound == want[$id])) || fail "vfio-pci" "${want[$id]} x $id bound to vfio-pci" "drivers: ${drivers[*]:-no device}"
  done
}

check_kernel() {
  local running arg groups
  running=" $(cat "$ROOT/proc/cmdline") "
  for arg in "${kernel_args[@]}"; do
    [[ "$running" == *" $arg "* ]] || fail "kernel command line" "$arg" "${running:1:-1}"
  done
  if [[ " ${kernel_args[*]} " == *"_iommu=on "* ]]; then
    groups=("$ROOT"/sys/kernel/iommu_groups/*)
    [[ -e "${groups[0]}" ]] || fail "IOMMU groups" "at least one (is the VM's vIOMMU on?)" "none"
  fi
}

# check_kernel_release: the RUNNING kernel (uname -r, not the installed packages: a newer kernel only counts once
# booted) is older than --kernel-below.
check_kernel_release() {
  local running
  running="$(uname -r)"
  [[ "$kernel_below" =~ ^([0-9]+)\.([0-9]+)$ ]] || fail "arguments" "--kernel-below MAJOR.MINOR" "$kernel_below"
  local below=$((BASH_REMATCH[1] * 1000 + BASH_REMATCH[2]))
  [[ "$running" =~ ^([0-9]+)\.([0-9]+) ]] || fail "uname -r" "a kernel release" "$running"
  local why="vm-vgpu: NVIDIA supports the GPU Operator's KubeVirt vGPU, mediated devices, below kernel"
  if ((BASH_REMATCH[1] * 1000 + BASH_REMATCH[2] >= below)); then
    fail "running kernel (uname -r)" "older than $kernel_below ($why $kernel_below only, e.g. Ubuntu 22.04's 5.15)" \
      "$running"
  fi
}

check_kubelet() {
  local have
  have="$(installed_version kubelet)"
  [[ "$have" == "1.$kubernetes."* ]] || fail "kubelet package" "1.$kubernetes.x" "${have:-not installed}"
}

check_vm_hardware() {
  local seen kib
  if [[ -n "$cpus" ]]; then
    seen="$(grep -c '^processor' "$ROOT/proc/cpuinfo" || true)"
    [[ "$seen" == "$cpus" ]] || fail "/proc/cpuinfo" "$cpus processors" "$seen (a VM restart still pending?)"
  fi
  if [[ -n "$memory_mib" ]]; then
    kib="$(awk '$1 == "MemTotal:" { print $2 }' "$ROOT/proc/meminfo")"
    [[ "$kib" =~ ^[0-9]+$ ]] || fail "/proc/meminfo" "a MemTotal line" "none"
    ((kib * 10 >= memory_mib * 1024 * 7 && kib <= memory_mib * 1024)) ||
      fail "/proc/meminfo MemTotal" "70-100% of ${memory_mib} MiB" "$((kib / 1024)) MiB (a VM restart still pending?)"
  fi
}

check_kvm() {
  [[ -e "$ROOT/dev/kvm" ]] ||
    fail "/dev/kvm" "the KVM device (nested virtualization: cpu host, and nested=1 in the Proxmox node's kvm module)" \
      "none"
}

main() {
  local joined=0
  guest_begin
  if rollout_joined; then
    joined=1
    rollout_resume
  fi
  check_pci
  # The kernel release first: on a kernel that cannot serve vGPUs, the rest does not matter.
  [[ -n "$kernel_below" ]] && check_kernel_release
  ((${#kernel_args[@]})) && check_kernel
  ((vfio)) && check_vfio
  ((kvm)) && check_kvm
  ((nvidia_smi)) && check_nvidia_smi
  ((containerd_nvidia)) && check_containerd
  [[ -n "$kubernetes" ]] && check_kubelet
  check_vm_hardware
  echo "verify: ok: $(printf '%s\n' "${gpus[@]#*=}" | paste -sd, -)"
  # The reboot the driver step scheduled (its marker names the boot it was scheduled from) happened and the node
  # passed: the marker has done its job. One of this boot stays: that reboot is still to come.
  if marker reboot.pending && [[ "$(cut -d' ' -f1 "$ROOT$STATE_DIR/reboot.pending")" != "$(boot_id)" ]]; then
    unmark reboot.pending
  fi
  if ((joined)); then
    rollout_end
  fi
}

main "$@" </dev/null
