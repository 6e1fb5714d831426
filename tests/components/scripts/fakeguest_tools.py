"""The stubbed tools of the fake Ubuntu guest (``FakeGuest``): sh bodies for ``FakeRoot.stub_script``. Every state
they keep is a file under ``$PGC_ROOT``; ``FakeGuest``'s docstring says what each models and how."""

from __future__ import annotations

from tests.components.scripts.fakeguest_apt import APT_CACHE, APT_GET, APT_MARK, DPKG, DPKG_QUERY
from tests.components.scripts.fakeguest_containerd import CONTAINERD, CRICTL, DEFAULT_CONTAINERD, NVIDIA_CTK

KERNEL = "6.8.0-49-generic"
__all__ = ["DEFAULT_CONTAINERD", "KERNEL", "STUBS"]
# Shared sh helpers: the package database (version per package; a status file for those not configured yet),
# DKMS's build, and containerd (re)starting with the configuration files as they are now.
_COMMON = r"""R="$PGC_ROOT"; D="$R/var/lib/fake-dpkg"; S="$R/var/lib/fake-dpkg-status"
dkms_autoinstall() {
  v=""; lic="NVIDIA"
  for f in "$D"/nvidia-headless-*; do
    [ -f "$f" ] && [ ! -f "$S/${f##*/}" ] || continue
    v="$(cut -d- -f1 < "$f")"; case "$f" in *-open) lic="Dual MIT/GPL" ;; *) lic="NVIDIA" ;; esac
  done
  [ -n "$v" ] || return 0
  for h in "$D"/linux-headers-[0-9]*; do
    [ -f "$h" ] && [ ! -f "$S/${h##*/}" ] || continue
    k="${h##*/linux-headers-}"; mkdir -p "$R/lib/modules/$k/updates/dkms"
    printf "%s\nlicense=%s\n" "$v" "$lic" > "$R/lib/modules/$k/updates/dkms/nvidia.ko"
  done
}
# configure_all <exit code on error>: run the postinst of every unpacked package (DKMS for the driver).
configure_all() {
  for st in "$S"/*; do
    [ -f "$st" ] || continue; p="${st##*/}"
    case "$p" in nvidia-headless-*) if [ -f "$R/fake-dkms-fail" ]; then
      echo "Error! Bad return status for module build on kernel: $(cat "$R/fake-kernel") (x86_64)" >&2
      echo "Consult /var/lib/dkms/nvidia/$(cut -d- -f1 < "$D/$p")/build/make.log for more information." >&2
      echo "dpkg: error processing package $p (--configure):" >&2
      echo " installed $p package post-installation script subprocess returned error exit status 10" >&2
      echo iF > "$st"; [ "$1" = 100 ] && echo "E: Sub-process /usr/bin/dpkg returned an error code (1)" >&2
      exit "$1"; fi ;;
    esac
    rm -f "$st"
  done
  dkms_autoinstall
}
containerd_started() {
  rm -rf "$R/fake-running/containerd"; mkdir -p "$R/fake-running/containerd"
  [ -f "$R/etc/containerd/config.toml" ] && cp "$R/etc/containerd/config.toml" "$R/fake-running/containerd/"
  [ -d "$R/etc/containerd/conf.d" ] && cp -r "$R/etc/containerd/conf.d" "$R/fake-running/containerd/"
  return 0
}
"""

_CURL = r"""url=""; for a in "$@"; do url="$a"; done
if [ -f "$R/fake-offline" ]; then echo "curl: (6) Could not resolve host: ${url#https://}" | sed 's|/.*||' >&2; exit 6; fi
echo "-----BEGIN PGP PUBLIC KEY BLOCK-----"; echo; echo "mQINBFfakeKEYfor${url##*/}"
if [ -f "$R/fake-curl-truncate" ]; then
  rm -f "$R/fake-curl-truncate"; echo "curl: (18) transfer closed with outstanding read data remaining" >&2; exit 18
fi
echo "=CRC1"; echo "-----END PGP PUBLIC KEY BLOCK-----"
"""

# --dearmor writes as it decodes (a cut armor leaves a partial keyring); --show-keys lists a complete keyring.
_GPG = r"""out=""; mode=""; file=""
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift ;; --dearmor) mode=dearmor ;; --show-keys) mode=show ;; -*) ;; *) file="$1" ;; esac
  shift
done
if [ "$mode" = dearmor ]; then
  { echo "fake-openpgp-keyring"; sed -e '/^-----/d' -e '/^$/d'; } > "$out"
  grep -qx "=CRC1" "$out" || { echo "gpg: [stdin]: invalid armor: premature end of file" >&2; exit 2; }
  exit 0
fi
if [ "$(head -n 1 "$file" 2>/dev/null)" = fake-openpgp-keyring ] && grep -qx "=CRC1" "$file"; then
  echo "pub   rsa4096 2017-06-07 [SC]"; echo "      C95B321B61E88C1809C4F759DDCAE044F796ECB0"; exit 0
fi
echo "gpg: no valid OpenPGP data found." >&2; exit 2"""

_BIND_VFIO = r"""bind_vfio() {
  grep -q "_iommu=on" "$R/proc/cmdline" || return 0
  ids="$(sed -n 's/^options vfio-pci ids=//p' "$R"/etc/modprobe.d/*.conf 2>/dev/null | tr , ' ')"
  for dev in "$R"/sys/bus/pci/devices/*; do
    [ -L "$dev/driver" ] && continue
    id="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
    for want in $ids; do
      [ "$id" = "$want" ] && ln -s ../../../bus/pci/drivers/vfio-pci "$dev/driver"
    done
  done
  return 0
}
"""

# A module file here is its version, then "license=<MODULE_LICENSE>" (open: "Dual MIT/GPL", proprietary: "NVIDIA";
# NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv.c, and the proprietary build's). module_taint <file>: the
# flags the kernel shows in /sys/module/<name>/taint for it when loaded: P for a licence that is not GPL-compatible,
# O out-of-tree, E unsigned (Documentation/ABI/testing/sysfs-module; kernel/module/main.c).
# find_module <name>: the module file modprobe and modinfo use for the running kernel: DKMS's build under updates/
# before a precompiled one under kernel/ (Ubuntu's /etc/depmod.d/ubuntu.conf: "search updates ubuntu built-in";
# depmod.d(5)); nothing when there is neither.
_FIND_MODULE = r"""module_taint() {
  if grep -qx 'license=NVIDIA' "$1"; then echo POE; else echo OE; fi
}
find_module() {
  d="$R/lib/modules/$(cat "$R/fake-kernel")"
  for f in "$d/updates/dkms/$1.ko" "$d"/kernel/nvidia-*/"$1.ko"; do [ -f "$f" ] && { echo "$f"; return; }; done
  echo "$d/updates/dkms/$1.ko"
}
"""

_MODPROBE = (
    _BIND_VFIO
    + _FIND_MODULE
    + r"""ko="$(find_module nvidia)"
if [ "$1" = -r ]; then  # every module named, in order; one in use (a "<name>-busy" file) stops it
  shift
  for m in "$@"; do
    [ -f "$R/$m-busy" ] && [ -d "$R/sys/module/$m" ] && { echo "modprobe: FATAL: Module $m is in use." >&2; exit 1; }
    rm -rf "$R/sys/module/$m"
  done
  exit 0
fi
case "$1" in
nvidia)
  [ -f "$ko" ] || { echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/$(cat "$R/fake-kernel")" >&2; exit 1; }
  [ -d "$R/sys/module/nouveau" ] && { echo "modprobe: ERROR: could not insert 'nvidia': No such device" >&2; exit 1; }
  [ -d "$R/sys/module/nvidia" ] && exit 0
  mkdir -p "$R/sys/module/nvidia"; sed -n 1p "$ko" > "$R/sys/module/nvidia/version"
  module_taint "$ko" > "$R/sys/module/nvidia/taint" ;;
vfio-pci) mkdir -p "$R/sys/module/vfio_pci"; bind_vfio ;;
br_netfilter)
  mkdir -p "$R/sys/module/br_netfilter" "$R/proc/sys/net/bridge"
  [ -f "$R/proc/sys/net/bridge/bridge-nf-call-iptables" ] || echo 1 > "$R/proc/sys/net/bridge/bridge-nf-call-iptables"
  [ -f "$R/proc/sys/net/bridge/bridge-nf-call-ip6tables" ] || echo 1 > "$R/proc/sys/net/bridge/bridge-nf-call-ip6tables" ;;
*) mkdir -p "$R/sys/module/$1" ;;
esac"""
)

_MODINFO = (
    _FIND_MODULE
    + r"""ko="$(find_module "$3")"
[ -f "$ko" ] || { echo "modinfo: ERROR: Module $3 not found." >&2; exit 1; }
case "$2" in license) sed -n 's/^license=//p' "$ko" ;; *) sed -n 1p "$ko" ;; esac
"""
)

# grub-mkconfig: source /etc/default/grub then grub.d/*.cfg, write grub.cfg.new and rename it.
_UPDATE_GRUB = r"""k="$(cat "$R/fake-kernel")"; mkdir -p "$R/boot/grub"
( GRUB_CMDLINE_LINUX=""; GRUB_CMDLINE_LINUX_DEFAULT=""
  . "$R/etc/default/grub"
  for f in "$R"/etc/default/grub.d/*.cfg; do [ -f "$f" ] && . "$f"; done
  printf "### generated by update-grub from /etc/default/grub and /etc/default/grub.d/*.cfg\nmenuentry 'Ubuntu' {\n"
  printf "\tlinux\t/vmlinuz-%s root=LABEL=cloudimg-rootfs ro %s %s\n}\n" "$k" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"
) > "$R/boot/grub/grub.cfg.new"
mv "$R/boot/grub/grub.cfg.new" "$R/boot/grub/grub.cfg"
printf "Generating grub configuration file ...\nFound linux image: /boot/vmlinuz-%s\ndone\n" "$k" >&2"""

# mkinitramfs copies the modprobe configuration and /etc/initramfs-tools/modules into the image.
_UPDATE_INITRAMFS = r"""k="$(cat "$R/fake-kernel")"; out="$R/boot/initrd.img-$k"; mkdir -p "$R/boot"
{ echo "# initramfs for $k: the modprobe configuration and the modules it packs"
  for f in "$R"/etc/modprobe.d/*.conf "$R"/lib/modprobe.d/*.conf "$R"/usr/lib/modprobe.d/*.conf \
    "$R/etc/initramfs-tools/modules"; do
    [ -f "$f" ] && { echo "== ${f#"$R"}"; cat "$f"; }
  done
} > "$out.new"
mv "$out.new" "$out"; echo "update-initramfs: Generating /boot/initrd.img-$k" >&2"""

_SYSTEMD_RUN = r"""unit=""; for a in "$@"; do case "$a" in --unit=*) unit="${a#--unit=}" ;; esac; done
if [ -f "$R/fake-reboot-scheduled" ]; then
  echo "Failed to start transient timer unit: Unit $unit.timer was already loaded or has a fragment file." >&2; exit 1
fi
echo "$*" > "$R/fake-reboot-scheduled"; echo "Running timer as unit: $unit.timer" >&2"""

_SYSTEMCTL = r"""q=""; c="$1"; shift; [ "$1" = --quiet ] && { q=1; shift; }
en="$R/fake-systemd-enabled"; u="$1"
case "$c" in
restart) if [ "$u" = containerd ]; then containerd_started; fi ;;
enable) grep -qxF "$u" "$en" 2>/dev/null || { echo "$u" >> "$en"; echo "Created symlink /etc/systemd/system/multi-user.target.wants/$u.service." >&2; } ;;
is-enabled) grep -qxF "$u" "$en" 2>/dev/null && { [ -n "$q" ] || echo enabled; exit 0; }; [ -n "$q" ] || echo disabled; exit 1 ;;
is-active) case "$u" in *.timer) [ -f "$R/fake-reboot-scheduled" ] && exit 0 ;; esac; [ -n "$q" ] || echo inactive; exit 3 ;;
esac"""

_SYSCTL = r"""[ "$1" = --system ] || exit 0
for f in "$R"/etc/sysctl.d/*.conf; do
  [ -f "$f" ] || continue
  while IFS='= ' read -r key value; do
    case "$key" in ""|"#"*) continue ;; esac
    p="$R/proc/sys/$(echo "$key" | tr . /)"
    if [ -d "$(dirname "$p")" ]; then echo "$value" > "$p"; else echo "sysctl: cannot stat /proc/sys/$(echo "$key" | tr . /): No such file or directory" >&2; fi
  done < "$f"
done"""

_KUBEADM = r"""K="$R/etc/kubernetes"
if [ "$1" = reset ]; then
  rm -rf "$K/kubelet.conf" "$K/bootstrap-kubelet.conf" "$K/pki" "$K/manifests"
  echo "[reset] Deleted contents of the etc/kubernetes directory: /etc/kubernetes"; exit 0
fi
if [ "$1 $2" = "upgrade node" ]; then  # a worker (kubernetes v1.34.4 cmd/kubeadm/app/cmd/upgrade/node.go, phases/)
  [ -f "$K/kubelet.conf" ] || { echo "couldn't create a Kubernetes client from file \"/etc/kubernetes/kubelet.conf\": open /etc/kubernetes/kubelet.conf: no such file or directory" >&2; exit 1; }
  v="$(dpkg-query -W -f='${Version}' kubeadm 2>/dev/null)"
  echo "[upgrade] Reading configuration from the \"kubeadm-config\" ConfigMap in namespace \"kube-system\"..."
  echo "[upgrade/control-plane] Skipping phase. Not a control plane node."
  mkdir -p "$R/var/lib/kubelet"; echo "# written by kubeadm upgrade node ${v%%-*}" > "$R/var/lib/kubelet/config.yaml"
  echo "[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!"; exit 0
fi
cfg="$3"; stat -c %a "$cfg" > "$R/join-config-mode"; cp "$cfg" "$R/join-config"
printf "%s\n" "$cfg" > "$R/join-config-path"
echo "[preflight] Running pre-flight checks"
errs=""
for f in /etc/kubernetes/kubelet.conf /etc/kubernetes/bootstrap-kubelet.conf /etc/kubernetes/pki/ca.crt; do
  [ -e "$R$f" ] && errs="$errs	[ERROR FileAvailable-$(echo "$f" | tr / -)]: $f already exists
"
done
if [ -n "$errs" ]; then
  printf "error execution phase preflight: [preflight] Some fatal errors occurred:\n%s" "$errs" >&2
  echo "[preflight] If you know what you are doing, you can make a check non-fatal with \`--ignore-preflight-errors=...\`" >&2
  echo "To see the stack trace of this error execute with --v=5 or higher" >&2; exit 1
fi
mkdir -p "$K/pki"; echo "fake cluster CA" > "$K/pki/ca.crt"; echo "kind: Config" > "$K/bootstrap-kubelet.conf"
if [ -f "$R/fake-kubeadm-token-expired" ]; then  # kubeadm's discovery, after its retries (discovery/token/token.go)
  id="$(sed -n 's/^    token: "\([a-z0-9]*\)\..*"$/\1/p' "$cfg")"
  printf 'error execution phase preflight: couldn'"'"'t validate the identity of the API Server: could not find a JWS signature in the cluster-info ConfigMap for token ID "%s"\n' "$id" >&2
  echo "To see the stack trace of this error execute with --v=5 or higher" >&2; exit 1
fi
echo "[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap"
if [ -f "$R/fake-kubeadm-tls-timeout" ]; then
  echo "error execution phase kubelet-start: timed out waiting for the condition" >&2
  echo "To see the stack trace of this error execute with --v=5 or higher" >&2; exit 1
fi
node="$(sed -n 's/^  name: "\(.*\)"$/\1/p' "$cfg")"  # nodeRegistration.name: the certificate's CN
printf 'apiVersion: v1\nkind: Config\nusers:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem  # CN=system:node:%s\n' "$node" > "$K/kubelet.conf"
rm -f "$K/bootstrap-kubelet.conf"
echo "This node has joined the cluster"
"""

_NVIDIA_SMI = r"""if [ ! -f "$R/sys/module/nvidia/version" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi
lib=""; for f in "$D"/nvidia-utils-*; do [ -f "$f" ] && lib="$(cut -d- -f1 < "$f")"; done
if [ -n "$lib" ] && [ "$lib" != "$(cat "$R/sys/module/nvidia/version")" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"; echo "NVML library version: $lib"; exit 18
fi
if [ "$1" = -L ]; then cat "$R/fake-gpus"; else cat "$R/sys/module/nvidia/version"; fi"""

STUBS = {
    "apt-get": APT_GET,
    "dpkg": DPKG,
    "dpkg-query": DPKG_QUERY,
    "apt-mark": APT_MARK,
    "apt-cache": APT_CACHE,
    "curl": _CURL,
    "gpg": _GPG,
    "uname": 'cat "$R/fake-kernel"',
    "modprobe": _MODPROBE,
    "modinfo": _MODINFO,
    "update-grub": _UPDATE_GRUB,
    "update-initramfs": _UPDATE_INITRAMFS,
    "systemd-run": _SYSTEMD_RUN,
    "systemctl": _SYSTEMCTL,
    "sysctl": _SYSCTL,
    "swapoff": 'head -n 1 "$R/proc/swaps" > "$R/proc/swaps.n"; mv "$R/proc/swaps.n" "$R/proc/swaps"',
    "crictl": CRICTL,
    "containerd": CONTAINERD,
    "nvidia-ctk": NVIDIA_CTK,
    "nvidia-smi": _NVIDIA_SMI,
    "lspci": 'cat "$R/fake-lspci"',
    "kubeadm": _KUBEADM,
    "cloud-init": 'echo "status: done"',
}
"""Every stub's body, each preceded by the shared helpers."""
STUBS = {name: _COMMON + body for name, body in STUBS.items()}
