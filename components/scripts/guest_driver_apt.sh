#!/usr/bin/env bash
# The driver step's packages (guest_driver.sh, sent after this file, sets driver_pkg, utils_pkg, branch and
# version): Ubuntu's NVIDIA driver at one exact build, the kernel headers DKMS builds the module with, the holds
# and the purge. Sent after guest_lib.sh.
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
# shellcheck disable=SC2154 # driver_pkg, utils_pkg, branch and version are set by guest_driver.sh
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

# follow_kernel_updates: the running kernel's headers and the kernel-tracking headers are installed (never held:
# they must follow the kernel). A guest that booted a kernel without headers (no module: nvidia-smi fails) is
# repaired here: the headers make DKMS build the module, which module_current then loads, without a reboot.
follow_kernel_updates() {
  local pkg running images wanted missing=()
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
# Lowering the pin downgrades the family (apt_install allows downgrades).
install_driver() {
  local have want headers
  headers="linux-headers-$(uname -r)"
  have="$(installed_version "$driver_pkg")"
  if [[ -n "$have" && "$(installed_version "$utils_pkg")" == "$have" && ("$have" == "$version"-* || -z "$version") ]]; then
    # Branch pin only: whatever 580.x is installed stays (the packages are held; upgrades are explicit).
    echo "driver: $driver_pkg $have (present)"
  else
    dpkg_repair
    apt_update
    if [[ -n "$version" ]]; then
      want="$(candidate "$driver_pkg" "$version")"
    else
      want="$(apt-cache madison "$driver_pkg" | awk '{ print $3; exit }')"
    fi
    [[ -n "$want" ]] || fail "$driver_pkg" "a ${version:-$branch}-* package in the archive" \
      "$(apt-cache madison "$driver_pkg" | awk '{print $3}' | paste -sd, - || true)"
    refuse_transitional "$want"
    driver_family "$want" "$driver_pkg" "$utils_pkg"
    apt_install "$headers" "${FAMILY[@]/%/=$want}"
    mark_dependencies
    echo "driver: $driver_pkg $(installed_version "$driver_pkg") (installed)"
  fi
  hold "$driver_pkg" "$utils_pkg"
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

purge_driver() {
  local pkgs=() pkg
  for pkg in "$driver_pkg" "$utils_pkg"; do
    [[ -n "$(installed_version "$pkg")" ]] && pkgs+=("$pkg")
  done
  if ((${#pkgs[@]} == 0)); then
    echo "driver: nothing to purge"
    return 0
  fi
  tool "apt-mark unhold" apt-mark unhold "${pkgs[@]}"
  apt "apt-get purge" purge -y -q "${pkgs[@]}"
  echo "driver: purged ${pkgs[*]} (the running module stays until the next boot)"
}
