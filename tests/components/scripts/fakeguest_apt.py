"""The fake guest's package tools (apt-get, dpkg, dpkg-query, apt-mark, apt-cache): sh bodies for the stubs of
``FakeGuest``, run after the shared helpers of ``fakeguest_tools.py`` (the package database, DKMS's build, containerd
starting). ``FakeGuest``'s docstring says what each models; test_real_apt.py checks them against the real apt."""

from __future__ import annotations

APT_GET = r"""cmd=""; timeout=""; error_on=""; pkgs=""; skip=""; change_held=""; downgrades=""
for a in "$@"; do
  if [ -n "$skip" ]; then case "$a" in DPkg::Lock::Timeout=*) timeout="${a#*=}" ;; esac; skip=""; continue; fi
  case "$a" in
    -o) skip=1 ;;
    --error-on=any) error_on=1 ;;
    --allow-change-held-packages) change_held=1 ;;
    --allow-downgrades) downgrades=1 ;;
    -*) ;;
    update|install|purge) cmd="$a" ;;
    *) pkgs="$pkgs $a" ;;
  esac
done
if [ -f "$R/fake-apt-lock" ]; then
  read -r pid name secs < "$R/fake-apt-lock"
  if [ -z "$timeout" ] || [ "$timeout" -lt "$secs" ]; then
    [ -n "$timeout" ] && echo "Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process $pid ($name)... ${timeout}s" >&2
    echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process $pid ($name)" >&2
    echo "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?" >&2
    exit 100
  fi
  rm -f "$R/fake-apt-lock"  # released within the wait
fi
if [ "$cmd" = update ]; then
  if [ -f "$R/fake-offline" ]; then
    lvl=W; [ -n "$error_on" ] && lvl=E
    echo "Err:1 http://archive.ubuntu.com/ubuntu noble InRelease"
    echo "  Temporary failure resolving 'archive.ubuntu.com'"
    echo "$lvl: Failed to fetch http://archive.ubuntu.com/ubuntu/dists/noble/InRelease  Temporary failure resolving 'archive.ubuntu.com'" >&2
    echo "$lvl: Some index files failed to download. They have been ignored, or old ones used instead." >&2
    [ -n "$error_on" ] && exit 100
  fi
  echo "Reading package lists..."; exit 0
fi
if ls "$S"/* >/dev/null 2>&1; then
  echo "E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem." >&2; exit 100
fi
todo=""; gone=""
for a in $pkgs; do
  p="${a%%=*}"; v="${a#*=}"; f="$R/var/lib/fake-archive/$p"
  if [ "$cmd" = purge ]; then todo="$todo $p"; continue; fi
  case "$a" in *=*) ;; *-)
    # "<package>-" on install's line removes it (apt-get(8)); one not installed is left as it is.
    p="${a%-}"
    [ -f "$D/$p" ] || { echo "Package '$p' is not installed, so not removed"; continue; }
    if [ -z "$change_held" ] && grep -qxF "$p" "$R/var/lib/fake-holds" 2>/dev/null; then
      echo "E: Held packages were changed and -y was used without --allow-change-held-packages." >&2; exit 100
    fi
    gone="$gone $p"; continue ;;
  esac
  [ -f "$f" ] || { echo "E: Unable to locate package $p" >&2; exit 100; }
  old="$(cat "$D/$p" 2>/dev/null || true)"
  if [ "$v" = "$a" ]; then
    # No version named: the candidate, the archive's newest, unless the installed one is newer: apt never picks
    # an older version by itself, --allow-downgrades or not (apt_preferences(5); test_real_apt_join.py).
    v="$(head -n 1 "$f")"
    if [ -n "$old" ] && /usr/bin/dpkg --compare-versions "$v" lt "$old"; then v="$old"; fi
  fi
  grep -qxF "$v" "$f" || [ "$v" = "$old" ] || { echo "E: Version '$v' for '$p' was not found" >&2; exit 100; }
  if [ -z "$change_held" ] && grep -qxF "$p" "$R/var/lib/fake-holds" 2>/dev/null && [ "$(cat "$D/$p" 2>/dev/null)" != "$v" ]; then
    echo "E: Held packages were changed and -y was used without --allow-change-held-packages." >&2; exit 100
  fi
  if [ -z "$downgrades" ] && [ -n "$old" ] && /usr/bin/dpkg --compare-versions "$v" lt "$old"; then
    echo "E: Packages were downgraded and -y was used without --allow-downgrades." >&2; exit 100
  fi
  todo="$todo $p=$v"
  # kubeadm 1.30 and 1.31 depend on cri-tools, later ones on nothing (kubernetes/release
  # cmd/krel/templates/latest/metadata.yaml; k8srepo.py).
  case "$p=$v" in kubeadm=1.30.* | kubeadm=1.31.*) todo="$todo cri-tools=1.30.0-1.1" ;; esac
done
mkdir -p "$D" "$S"
if [ "$cmd" = purge ]; then
  for p in $todo; do
    rm -f "$D/$p" "$S/$p"
    case "$p" in nvidia-headless-*) rm -f "$R"/lib/modules/*/updates/dkms/nvidia.ko ;; esac  # dkms remove
  done
  exit 0
fi
for p in $gone; do
  rm -f "$D/$p" "$S/$p"
  case "$p" in nvidia-headless-*) rm -f "$R"/lib/modules/*/updates/dkms/nvidia.ko ;; esac  # dkms remove
done
for pv in $todo; do
  p="${pv%%=*}"; [ "$(cat "$D/$p" 2>/dev/null)" = "${pv#*=}" ] && continue
  printf "%s" "${pv#*=}" > "$D/$p"; echo iU > "$S/$p"
done
if [ -f "$R/fake-apt-kill-after-unpack" ]; then rm -f "$R/fake-apt-kill-after-unpack"; kill -KILL 0; fi
configure_all 100
case " $todo " in *" containerd="*) containerd_started ;; esac  # its postinst starts the service
exit 0"""

DPKG = r"""action=""; for a in "$@"; do case "$a" in --audit|--configure) action="$a" ;; esac; done
case "$action" in
--audit)
  any=""
  for st in "$S"/*; do
    [ -f "$st" ] || continue
    [ -z "$any" ] && echo "The following packages have been unpacked but not yet configured or are half configured:"
    echo " ${st##*/}"; any=1
  done
  [ -z "$any" ] ;;
--configure) configure_all 1 ;;
*) echo "dpkg: fake: unsupported $*" >&2; exit 2 ;;
esac"""

# The two formats the steps use, -f='${db:Status-Abbrev} ${Version}\n' and -f='${db:Status-Abbrev} ${Package}\n':
# "ii  <version>" or "ii  <package>" (iU/iF when unpacked but not configured); a pattern: "<status>  <package>" each,
# as the steps only ask a pattern for names.
DPKG_QUERY = r"""p="$3"
# A held package's selection is "h" (hi), as dpkg-query reports it (the real one: test_real_apt.py).
st_of() { st="$(cat "$S/$1" 2>/dev/null || echo ii)"; grep -qxF "$1" "$R/var/lib/fake-holds" 2>/dev/null && st="h${st#?}"; echo "$st"; }
case "$p" in *"*"*)
  for f in "$D"/$p; do [ -f "$f" ] && printf "%s  %s\n" "$(st_of "${f##*/}")" "${f##*/}"; done; exit 0 ;;
esac
[ -f "$D/$p" ] || { echo "dpkg-query: no packages found matching $p" >&2; exit 1; }
case "$2" in *'${Package}'*) printf "%s  %s\n" "$(st_of "$p")" "$p" ;; *) printf "%s  %s\n" "$(st_of "$p")" "$(cat "$D/$p")" ;; esac
"""

APT_MARK = r"""h="$R/var/lib/fake-holds"; touch "$h"
while [ "$1" = -o ]; do shift 2; done
c="$1"; shift
case "$c" in
showhold) cat "$h" ;;
hold) for p in "$@"; do grep -qxF "$p" "$h" || echo "$p" >> "$h"; echo "$p set on hold."; done ;;
unhold) for p in "$@"; do grep -vxF "$p" "$h" > "$h.new" || true; mv "$h.new" "$h"; done ;;
esac"""

# madison: every version, newest first; show P=V...: a record per version the archive has (no Depends: the fake
# archive's packages depend on nothing), nothing for a version it lacks, and "E: No packages found" (exit 100) only
# when it knows none of the packages, as apt-cache 2.6 (contract: test_real_apt.py).
APT_CACHE = r"""if [ "$1" = show ]; then
  shift; found=""
  for a in "$@"; do
    p="${a%%=*}"; v="${a#*=}"; f="$R/var/lib/fake-archive/$p"
    [ -f "$f" ] || continue
    found=1; grep -qxF "$v" "$f" && printf "Package: %s\nVersion: %s\n\n" "$p" "$v"
  done
  [ -n "$found" ] || { echo "E: No packages found" >&2; exit 100; }
  exit 0
fi
f="$R/var/lib/fake-archive/$2"; [ -f "$f" ] || exit 0
while read -r v; do printf " %s | %s | http://archive.ubuntu.com/ubuntu noble/restricted\n" "$2" "$v"; done < "$f"
"""
