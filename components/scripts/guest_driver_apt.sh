#!/usr/bin/env bash
# The driver step's packages (guest_driver.sh, sent after this file, sets the package names, branch and version):
# Ubuntu's NVIDIA driver at one exact build, its kernel module (precompiled or DKMS's, with the kernel headers DKMS
# builds it with), the holds and the purge. Sent after guest_lib.sh.
#
# Why every package of the driver's family is named with its version: Ubuntu's driver packages depend on each other
# at exact versions (nvidia-headless-no-dkms-B on libnvidia-compute-B (= ${binary:Version}) and the others,
# nvidia-utils-B on the virtual nvidia-kernel-common-B-<upstream>), while the metapackage nvidia-headless-B depends
# on nvidia-headless-no-dkms-B and nvidia-dkms-B WITHOUT a version (canonical/nvidia-graphics-drivers,
# debian/templates/control.in on branch 580-server-noble). apt resolves an unversioned dependency to its candidate
# (the newest build) and never picks an older one by itself, so `install headless=OLD utils=OLD` fails as soon as
# Ubuntu publishes a newer build (apt 2.6: "nvidia-utils-580-server : Depends: nvidia-kernel-common-580-server-OLD
# ... Unable to correct problems", exit 100). The family is read from the archive: the packages the driver and
# utilities depend on, transitively, that the archive has at exactly the chosen version (one source's build).
#
# A retired branch is published as transitional packages that depend on the successor's (570-server on noble:
# "nvidia-headless-570-server-open Depends: nvidia-headless-580-server-open", section oldlibs; the same repository,
# commit d27e751b "Release transitionals to 580"). Installing one would install the successor's driver under the
# old name; the step refuses before installing anything.
# shellcheck disable=SC2154 # the package names, branch, suffix, open and version are set by guest_driver.sh
set -euo pipefail

# archive_records <package=version>...: RECORDS: the archive's control records of those versions (apt-cache show
# prints nothing for a version it lacks, and "E: No packages found", exit 100, when it knows none of the packages:
# both read as no record). Any other failure fails the step. A variable, not output: a failure inside $(...) would
# not stop the step.
archive_records() {
  local rc=0
  RECORDS="$(apt-cache show "$@" 2>&1)" || rc=$?
  if ((rc)); then
    grep -q '^E: No packages found' <<<"$RECORDS" || fail_output "$RECORDS" "apt-cache show $*" "the archive's records" "$rc"
    RECORDS=""
  fi
}

# record_fields <records>: "P <package>" per record and "D <name>" per package its Depends name (alternatives too;
# versions, architecture qualifiers and restrictions dropped).
record_fields() {
  awk '/^Package: / { print "P " $2 }
    /^Depends: / {
      sub(/^Depends: /, ""); n = split($0, deps, /[,|]/)
      for (i = 1; i <= n; i++) {
        d = deps[i]; sub(/[([].*/, "", d); sub(/:.*/, "", d); gsub(/[ \t]/, "", d)
        if (d != "") print "D " d
      }
    }' <<<"$1"
}

# driver_family <version> <package>...: FAMILY: the packages to install at <version>: the given ones and every
# package they depend on, transitively, that the archive has at exactly that version. Dependencies from elsewhere
# (dkms, libc6, a virtual package) stay apt's choice. One apt-cache call per level of the dependency tree.
driver_family() {
  local want="$1" level=() next=() seen=" " kind name pkg
  shift
  level=("$@")
  FAMILY=()
  while ((${#level[@]})); do
    for pkg in "${level[@]}"; do seen+="$pkg "; done
    next=()
    archive_records "${level[@]/%/=$want}"
    while read -r kind name; do
      case "$kind" in
      P) FAMILY+=("$name") ;;
      D) [[ "$seen" == *" $name "* || " ${next[*]} " == *" $name "* ]] || next+=("$name") ;;
      esac
    done < <(record_fields "$RECORDS")
    level=("${next[@]}")
  done
}

# refuse_transitional <version>: stop, before anything is installed, when the driver package at that version is a
# retired branch's transitional package (it depends on another branch's nvidia-headless package).
refuse_transitional() {
  local kind name
  archive_records "$driver_pkg=$1"
  while read -r kind name; do
    if [[ "$kind" == D && "$name" =~ ^nvidia-headless-([0-9]{3}) && "${BASH_REMATCH[1]}" != "$branch" ]]; then
      fail "$driver_pkg $1" "the $branch driver" "a transitional package to the ${BASH_REMATCH[1]} branch ($name): branch $branch is retired; pin driverBranch ${BASH_REMATCH[1]}"
    fi
  done < <(record_fields "$RECORDS")
}

# The kernel module comes precompiled when the archive has it for the running kernel at the chosen build, by DKMS
# otherwise. Ubuntu's linux-restricted-modules publishes, per kernel, linux-modules-nvidia-<B>[-server][-open]-<kernel>
# (the signed module under /lib/modules/<kernel>/kernel/) depending on nvidia-kernel-common-<B>[-server] at exactly
# the upstream version it was built against, and per kernel flavour a metapackage (...-generic) that depends on the
# newest kernel's; ubuntu-drivers installs that pair and falls back to nvidia-dkms when the kernel's package is
# missing (canonical/ubuntu-drivers-common, UbuntuDrivers/detect.py, get_linux_modules_metapackage). The packages
# are built against the archive's current build of each branch only, so an older pinned build gets DKMS.

# lrm_name <kernel or flavour>: the precompiled modules package of this driver for it.
lrm_name() {
  printf 'linux-modules-nvidia-%s%s%s-%s\n' "$branch" "$suffix" "$open" "$1"
}

# built_against <records>: "<package> <version> <upstream>" per record that depends on this branch's
# nvidia-kernel-common at ">= <upstream>" (the build the precompiled module was made for).
built_against() {
  awk -v common="nvidia-kernel-common-$branch$suffix" '
    /^Package: / { p = $2 } /^Version: / { v = $2 }
    /^Depends: / {
      n = split(substr($0, 10), deps, /, */)
      for (i = 1; i <= n; i++) if (index(deps[i], common " (>= ") == 1) {
        u = substr(deps[i], length(common) + 6); sub(/\).*/, "", u); print p, v, u
      }
    }' <<<"$1"
}

# precompiled_for <kernel> <upstream>: PRECOMPILED: "<package>=<version>" of the archive's precompiled module for
# that kernel built against that upstream version (exit 1 and empty when it has none).
precompiled_for() {
  local pkg ver up
  PRECOMPILED=""
  archive_records "$(lrm_name "$1")"
  while read -r pkg ver up; do
    if [[ "$up" == "$2" ]]; then
      PRECOMPILED="$pkg=$ver"
      return 0
    fi
  done < <(built_against "$RECORDS")
  return 1
}

# driver_anchor: driver_pkg is the package that says which build this node runs: nvidia-headless-<...> when the
# module is DKMS's, nvidia-headless-no-dkms-<...> alone when it is precompiled (no such package: a new node, DKMS's
# name until install_driver chooses).
driver_anchor() {
  if [[ -z "$(installed_version "$dkms_pkg")" && -n "$(installed_version "$nodkms_pkg")" ]]; then
    driver_pkg="$nodkms_pkg"
  fi
}

# installed_matching <glob>: "<package>-" (apt-get's removal) for each package matching the glob that is on the
# machine in any state but "not installed" or "config-files" (dpkg-query(1)): a run killed inside apt-get may leave
# the selection at deinstall ("ri"), which apt-get install ignores and would upgrade instead.
installed_matching() {
  local status pkg
  while read -r status pkg; do
    if [[ "$status" == ?[iUFWth]* ]]; then printf '%s-\n' "$pkg"; fi
  done < <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "$1" 2>/dev/null || true)
}

# other_kind: removals (installed_matching) of the other module kind's driver packages (open <-> proprietary at
# one branch and flavour). apt does not swap them by itself: the kernel source packages conflict and the old ones
# are held ("pkgProblemResolver::Resolve generated breaks, this may be caused by held packages", apt 2.6).
other_kind() {
  local other="-open" pkg
  [[ -z "$open" ]] || other=""
  for pkg in nvidia-headless nvidia-headless-no-dkms nvidia-dkms nvidia-kernel-source; do
    installed_matching "$pkg-$branch$suffix$other"
  done
  if [[ -n "$other" ]]; then
    installed_matching "linux-modules-nvidia-$branch$suffix-open-*"
  else # the proprietary kind's glob matches the open kind's names too: those stay
    installed_matching "linux-modules-nvidia-$branch$suffix-*" | grep -v "^linux-modules-nvidia-$branch$suffix-open-" || true
  fi
}

# tracking_headers <dpkg-query listing of linux-image-*>: the linux-headers metapackage of every installed kernel
# metapackage (linux-image-virtual -> linux-headers-virtual). With it, each kernel update (unattended-upgrades)
# brings that kernel's headers, and DKMS (nvidia-dkms, a dependency of the headless package) builds the NVIDIA
# module for it before the next boot.
tracking_headers() {
  local status pkg
  while read -r status pkg; do
    [[ "$status" == [ih]i && "$pkg" =~ ^linux-image-([a-z][a-z0-9.-]*)$ ]] || continue
    printf 'linux-headers-%s\n' "${BASH_REMATCH[1]}"
  done <<<"$1"
}

# flavour_follows <upstream>: FLAVOUR_META: "<package>=<version>" of the precompiled modules' flavour metapackage
# (linux-modules-nvidia-...-generic) when the archive's newest one depends on a kernel's module built against that
# upstream version (exit 1 otherwise: Ubuntu has moved on to another build, so later kernels' modules will not fit).
flavour_follows() {
  local kernel flavour meta newest kind name
  kernel="$(uname -r)"
  flavour="${kernel#*-}"
  meta="$(lrm_name "${flavour#*-}")" # 6.8.0-49-generic -> ...-generic
  FLAVOUR_META=""
  newest="$(apt-cache madison "$meta" 2>/dev/null | awk '{ print $3; exit }')"
  [[ -n "$newest" ]] || return 1
  archive_records "$meta=$newest"
  while read -r kind name; do
    if [[ "$kind" == D && "$name" == "$(lrm_name "")"[0-9]* ]] && precompiled_for "${name#"$(lrm_name "")"}" "$1"; then
      FLAVOUR_META="$meta=$newest"
      return 0
    fi
  done < <(record_fields "$RECORDS")
  return 1
}

# follow_kernel_updates: a later kernel gets this build's module too. DKMS: the running kernel's headers and the
# kernel-tracking headers are installed (never held: they must follow the kernel); a guest that booted a kernel
# without headers (no module: nvidia-smi fails) is repaired here: the headers make DKMS build the module, which
# module_current then loads, without a reboot. Precompiled: the flavour metapackage, which brings each new kernel's
# module with it (ubuntu-drivers' choice), while the archive's is built against this build; once it is not
# (Ubuntu published a newer build), DKMS as above, as the safety net for the next kernel.
follow_kernel_updates() {
  local pkg running images wanted missing=() have
  if [[ "$driver_pkg" == "$nodkms_pkg" ]]; then
    have="$(installed_version "$driver_pkg")"
    if [[ -n "$(installed_version "$(lrm_name "$(uname -r)")")" ]] && flavour_follows "${have%%-*}"; then
      [[ -n "$(installed_version "${FLAVOUR_META%%=*}")" ]] || apt_install "$FLAVOUR_META"
      return 0
    fi
    [[ -n "$(installed_version "$nvidia_dkms")" ]] || missing+=("$nvidia_dkms=$have")
  fi
  running="linux-headers-$(uname -r)"
  # In this shell, not inside $(...): a failing query fails the step (read as "no kernel", it would skip them).
  images="$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'linux-image-*')"
  wanted="$(printf '%s\n' "$running"; tracking_headers "$images")"
  while read -r pkg; do
    [[ -n "$(installed_version "$pkg")" ]] || missing+=("$pkg")
  done <<<"$wanted"
  if ((${#missing[@]})); then
    apt_install "${missing[@]}"
    echo "driver: headers installed (${missing[*]}): DKMS builds the module for this and every later kernel"
  fi
}

# install_driver: the driver packages at the pin (a branch pin alone: the archive's newest build when none is
# installed), the whole family at that exact build, installed and configured (dpkg ii), and held (checked every run).
# Lowering the pin downgrades the family (apt_install allows downgrades). The module: precompiled when the archive
# has it for the running kernel at that build (the DKMS packages go), DKMS otherwise (precompiled ones go).
install_driver() {
  local have want kernel gone=()
  kernel="$(uname -r)"
  have="$(installed_version "$driver_pkg")"
  if [[ -n "$have" && "$(installed_version "$utils_pkg")" == "$have" && ("$have" == "$version"-* || -z "$version") ]]; then
    # Branch pin only: whatever 580.x is installed stays (the packages are held; upgrades are explicit).
    echo "driver: $driver_pkg $have (present)"
  else
    dpkg_repair
    apt_update
    driver_pkg="$dkms_pkg" # the archive's name for the driver either way (and what a retired branch renames)
    if [[ -n "$version" ]]; then
      want="$(candidate "$driver_pkg" "$version")"
    else
      want="$(apt-cache madison "$driver_pkg" | awk '{ print $3; exit }')"
    fi
    [[ -n "$want" ]] || fail "$driver_pkg" "a ${version:-$branch}-* package in the archive" \
      "$(apt-cache madison "$driver_pkg" | awk '{print $3}' | paste -sd, - || true)"
    refuse_transitional "$want"
    if precompiled_for "$kernel" "${want%%-*}"; then
      driver_pkg="$nodkms_pkg"
      mapfile -t gone < <(other_kind; installed_matching "$dkms_pkg"; installed_matching "$nvidia_dkms")
      driver_family "$want" "$driver_pkg" "$utils_pkg"
      apt_install "${FAMILY[@]/%/=$want}" "$PRECOMPILED" "${gone[@]}"
      echo "driver: module precompiled and signed (${PRECOMPILED%%=*}): no DKMS build"
    else
      mapfile -t gone < <({ other_kind; installed_matching "$(lrm_name '*')"; } | sort -u)
      driver_family "$want" "$driver_pkg" "$utils_pkg"
      apt_install "linux-headers-$kernel" "${FAMILY[@]/%/=$want}" "${gone[@]}"
      echo "driver: module built by DKMS (the archive has no precompiled one for kernel $kernel at ${want%%-*})"
    fi
    mark_dependencies
    echo "driver: $driver_pkg $(installed_version "$driver_pkg") (installed)"
  fi
  hold "$driver_pkg" "$utils_pkg"
  # The other way's driver package keeps no hold (a switch between the two, or a run killed before this line).
  if grep -qxF "$nodkms_pkg" <<<"$(apt-mark showhold)" && [[ "$driver_pkg" != "$nodkms_pkg" ]]; then
    tool "apt-mark unhold" apt-mark unhold "$nodkms_pkg"
  fi
}

# mark_dependencies: the family's other packages back to "automatically installed", as apt marks dependencies (a
# package named on apt-get's command line becomes manual): the purge then leaves them to autoremove as before.
# A run killed just before this leaves them manual; nothing else depends on the mark.
mark_dependencies() {
  local pkg deps=()
  for pkg in "${FAMILY[@]}"; do
    [[ "$pkg" == "$driver_pkg" || "$pkg" == "$utils_pkg" ]] || deps+=("$pkg")
  done
  if ((${#deps[@]})); then
    tool "apt-mark auto" apt-mark auto "${deps[@]}" >/dev/null
  fi
}

# host_driver_packages: the NVIDIA driver packages host driver mode installs (any branch, flavour or kind) that are
# on the machine: the driver and utilities (held by this step), DKMS's package and the precompiled modules.
host_driver_packages() {
  local pattern
  for pattern in 'nvidia-headless-[0-9]*' 'nvidia-headless-no-dkms-[0-9]*' 'nvidia-utils-[0-9]*' \
    'nvidia-dkms-[0-9]*' 'linux-modules-nvidia-[0-9]*'; do
    installed_matching "$pattern"
  done | sed 's/-$//' | sort -u
}

# remove_host_driver: operator and vfio modes: the host driver an earlier host mode installed goes. Left there, the
# GPU Operator takes it as pre-installed and never runs its driver container on the node (k8s-driver-manager:
# "NVIDIA GPU driver is already pre-installed on the node, will not proceed with the containerized driver
# installation", NVIDIA/gpu-operator#381), so the node would stay on the old build; a vfio node needs none. The marker, set
# first with this boot's id, says its module, still loaded, must go too (reboot_reason). Their dependencies stay
# for autoremove, as with --purge.
remove_host_driver() {
  local pkgs=()
  mapfile -t pkgs < <(host_driver_packages)
  ((${#pkgs[@]})) || return 0
  mark host-driver.removed
  unhold_and_purge "${pkgs[@]}"
  echo "driver: host driver removed (${pkgs[*]}): driver mode $mode"
}

# unhold_and_purge <package>...: the holds off, then the packages purged.
unhold_and_purge() {
  tool "apt-mark unhold" apt-mark unhold "$@" >/dev/null
  apt "apt-get purge" purge -y -q "$@"
}

# purge_driver: the driver, the utilities and the precompiled modules (the module is part of the driver).
purge_driver() {
  local pkgs=() pkg
  for pkg in "$driver_pkg" "$utils_pkg"; do
    [[ -n "$(installed_version "$pkg")" ]] && pkgs+=("$pkg")
  done
  while read -r pkg; do
    [[ -z "$pkg" ]] || pkgs+=("${pkg%-}")
  done < <(installed_matching "$(lrm_name '*')")
  if ((${#pkgs[@]} == 0)); then
    echo "driver: nothing to purge"
    return 0
  fi
  unhold_and_purge "${pkgs[@]}"
  echo "driver: purged ${pkgs[*]} (the running module stays until the next boot)"
}
