#!/usr/bin/env bash
# Step 4 of the guest bootstrap: kernel prerequisites, kubeadm/kubelet/kubectl from the Kubernetes apt
# repository for one minor version (held) and cri-tools, then `kubeadm join`. A node that has joined already is
# left alone; the leftovers of a join that failed half-way (bootstrap-kubelet.conf, pki/ca.crt without
# kubelet.conf: a TLS bootstrap that timed out), which fail kubeadm's preflight checks, are cleared with
# `kubeadm reset -f` first.
# A joined node one minor behind is upgraded in its rollout slot, as kubeadm's upgrade guide does a worker
# (kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/, "Upgrade worker nodes"): only once the API
# server is at the new minor (a kubelet is never newer than its API server), drain, kubeadm of the new minor,
# `kubeadm upgrade node`, kubelet and kubectl, kubelet restarted, then wait until the Node reports the new kubelet
# version; the verify step uncordons it. A marker records an upgrade begun, so a run killed anywhere in it finishes
# it (restarting a kubelet whose package is new already). Skipping a minor is unsupported by kubeadm, and a joined
# node is never downgraded: both are refused before anything changes.
# Sent after guest_lib.sh and guest_rollout.sh.
#
# Usage: guest_join.sh --node-name NAME --api-endpoint HOST:PORT|[IPV6]:PORT --minor NN [--rollout 1 ...]
# The bootstrap token and the CA cert hash are never arguments (a process list shows those): they arrive as
# shell variables PGC_JOIN_TOKEN and PGC_CA_CERT_HASH assigned at the top of this script's stdin, are never
# printed, and reach kubeadm inside a root-only JoinConfiguration file that is removed when the step ends.
set -euo pipefail
# shellcheck disable=SC2034 # read by die() in guest_lib.sh
STEP="join"

node_name="" api_endpoint="" minor=""
while (($#)); do
  case "$1" in
  --node-name) node_name="$2" ;;
  --api-endpoint) api_endpoint="$2" ;;
  --minor) minor="$2" ;;
  *) rollout_arg "$1" "$2" || die "unknown argument $1" ;;
  esac
  shift 2
done
[[ "$node_name" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] || fail "--node-name" "a DNS label" "'$node_name'"
[[ "$api_endpoint" =~ ^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$ ]] ||
  fail "--api-endpoint" "host:port or [IPv6]:port" "'$api_endpoint'"
[[ "$minor" =~ ^[0-9]{2}$ ]] || fail "--minor" "a two-digit minor version" "'$minor'"
rollout_check_args

KUBELET_CONF="/etc/kubernetes/kubelet.conf"
JOIN_CONFIG="" # global: the EXIT trap removes it after main has returned
PACKAGES=(kubelet kubeadm kubectl)
UPGRADE="kubernetes-upgrade" # marker: an upgrade to the minor it holds has begun on this joined node
KUBELET_WAIT=300             # seconds for the restarted kubelet to report its version

swap_off() {
  local fstab
  if [[ "$(wc -l 2>/dev/null <"$ROOT/proc/swaps" || echo 0)" -gt 1 ]]; then
    tool "swapoff -a" swapoff -a
    echo "swap: turned off"
  fi
  if [[ -f "$ROOT/etc/fstab" ]]; then
    # Keep swap off across reboots: comment out active swap entries, touch nothing else.
    fstab="$(awk '!/^[[:space:]]*#/ && $3 == "swap" { print "#" $0; next } { print }' "$ROOT/etc/fstab")"
    put /etc/fstab "$fstab"
  fi
}

SYSCTL="net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1"

# sysctl_applied: the running kernel has every value of $SYSCTL (observed in /proc/sys, whatever ran before).
sysctl_applied() {
  local key value
  while IFS=' =' read -r key value; do
    [[ "$(cat "$ROOT/proc/sys/${key//.//}" 2>/dev/null || true)" == "$value" ]] || return 1
  done <<<"$SYSCTL"
}

kernel_prerequisites() {
  local m
  put /etc/modules-load.d/kubernetes.conf "overlay
br_netfilter"
  for m in overlay br_netfilter; do
    loaded "$m" || tool "modprobe $m" modprobe "$m"
  done
  put /etc/sysctl.d/99-kubernetes.conf "$SYSCTL"
  if ! sysctl_applied; then
    tool "sysctl --system" sysctl --system >/dev/null
  fi
}

# kubernetes_repo: the minor's repository, and the newest build of kubeadm in it in BUILD. apt never picks an older
# version by itself, so `apt-get install kubeadm` on a node holding 1.(N+1) would keep it (a kubelet newer than the
# control plane) when the minor went down before the join (apt_preferences(5): a downgrade needs a pin priority
# above 1000 or an explicit version): every install names the build.
BUILD=""
kubernetes_repo() {
  apt_repo kubernetes "https://pkgs.k8s.io/core:/stable:/v1.$minor/deb/Release.key" \
    "https://pkgs.k8s.io/core:/stable:/v1.$minor/deb/ /"
  apt_update
  BUILD="$(apt-cache madison kubeadm | awk -v want="1.$minor." '{ if (index($3, want) == 1) { print $3; exit } }')"
  [[ -n "$BUILD" ]] || fail "kubeadm 1.$minor.x" "a build in pkgs.k8s.io v1.$minor" "none (apt-cache madison kubeadm)"
}

# installed_at <build> <package>...: each package is installed at the build, else the step fails.
installed_at() {
  local build="$1" pkg have
  shift
  for pkg in "$@"; do
    have="$(installed_version "$pkg")"
    [[ "$have" == "$build" ]] || fail "$pkg after apt-get install" "$build" "${have:-not installed}"
  done
}

install_kubernetes() {
  local pkg have current=1
  for pkg in "${PACKAGES[@]}"; do
    have="$(installed_version "$pkg")"
    [[ "$have" == "1.$minor."* ]] || current=0
  done
  [[ -n "$(installed_version cri-tools)" ]] || current=0
  if ((current)) && ! marker "$UPGRADE"; then
    echo "kubernetes: packages 1.$minor (present)"
    return 0
  fi
  have="$(installed_version kubelet)"
  if [[ -f "$ROOT$KUBELET_CONF" ]] && { [[ -n "$have" ]] || marker "$UPGRADE"; }; then
    if ! marker "$UPGRADE" && [[ "$have" == "1.$minor."* ]]; then
      complete_node "$have"
    else
      upgrade_node "$have"
    fi
    return 0
  fi
  local pinned=()
  unmark "$UPGRADE" # left by a node reset since: an upgrade means nothing on a node that has not joined
  kubernetes_repo
  for pkg in "${PACKAGES[@]}"; do pinned+=("$pkg=$BUILD"); done
  # crictl (cri-tools), which the verify step asks for the running containerd's config: kubeadm depends on it only
  # in 1.30 and 1.31 (kubernetes/release cmd/krel/templates/latest/metadata.yaml), so it is named; the minor's
  # repository has its build.
  apt_install "${pinned[@]}" cri-tools
  installed_at "$BUILD" "${PACKAGES[@]}"
}

# complete_node <installed kubelet version>: a joined node at the minor missing a package or holding one of another
# minor (cri-tools, which nodes joined before it was named lack; a package changed by hand) gets it at the kubelet's
# own build: the kubelet stays as it is, so nothing is drained.
complete_node() {
  local have="$1" pkg todo=()
  for pkg in kubeadm kubectl; do
    [[ "$(installed_version "$pkg")" == "1.$minor."* ]] || todo+=("$pkg=$have")
  done
  [[ -n "$(installed_version cri-tools)" ]] || todo+=(cri-tools)
  kubernetes_repo
  apt_install "${todo[@]}"
  for pkg in kubeadm kubectl; do
    [[ "$(installed_version "$pkg")" == "1.$minor."* ]] ||
      fail "$pkg after apt-get install" "1.$minor.x" "$(installed_version "$pkg")"
  done
  echo "kubernetes: packages 1.$minor completed at the kubelet's build $have"
}

# upgrade_node <installed kubelet version>: the joined node's minor upgrade (see the header), resumed when the
# marker says one has begun.
upgrade_node() {
  local have="$1" from why
  from="$(sed -n 's/^1\.\([0-9]*\)\..*/\1/p' <<<"$have")"
  if ! marker "$UPGRADE"; then
    [[ -n "$from" ]] || fail "kubelet" "a 1.N.P package" "'$have'"
    ((10#$from < 10#$minor)) || fail "kubernetes.version" "1.$from or later on a node that joined at 1.$from" \
      "1.$minor: a joined node is never downgraded (rebuild it: pulumi up --replace its VM)"
    ((10#$minor == 10#$from + 1)) || fail "kubernetes.version" "1.$((10#$from + 1)) (one minor at a time)" \
      "1.$minor: kubeadm does not skip minors; set kubernetes.version to each minor in turn"
    why="Kubernetes 1.$from -> 1.$minor"
  elif [[ "$(cat "$ROOT$STATE_DIR/$UPGRADE")" != "1.$minor" ]]; then
    fail "kubernetes.version" "$(cat "$ROOT$STATE_DIR/$UPGRADE") (an upgrade begun on this node)" "1.$minor"
  else
    why="Kubernetes 1.$minor (an upgrade begun earlier)"
  fi
  ((ROLLOUT)) || fail "kubernetes upgrade" "the rollout settings (--rollout 1)" "none"
  rollout_joined || fail "kubernetes upgrade" "node $node_name in the cluster" "none (kubectl get node)"
  upgrade_agent server --minor "$minor"
  rollout_begin "$why"
  marker "$UPGRADE" || mark "$UPGRADE" "1.$minor"
  kubernetes_repo
  apt_install "kubeadm=$BUILD"
  installed_at "$BUILD" kubeadm
  tool "kubeadm upgrade node" kubeadm upgrade node
  apt_install "kubelet=$BUILD" "kubectl=$BUILD" cri-tools
  installed_at "$BUILD" "${PACKAGES[@]}"
  tool "systemctl daemon-reload" systemctl daemon-reload
  tool "systemctl restart kubelet" systemctl restart kubelet
  upgrade_agent kubelet --node "$node_name" --version "v${BUILD%%-*}" --timeout "$KUBELET_WAIT" \
    --poll "$ROLLOUT_POLL"
  unmark "$UPGRADE"
  echo "kubernetes: upgraded to $BUILD (the verify step uncordons the node)"
}

# upgrade_agent <upgrade.py command and flags...>: run it as the node (kubelet's kubeconfig), failing the step.
upgrade_agent() {
  python3 "$PGC_AGENT_DIR/upgrade.py" "$@" --kubeconfig "$ROLLOUT_KUBECONFIG" --api "$ROLLOUT_API" || exit
}

# kubelet_enabled: kubelet starts at boot (checked every run: a run killed after the install did not enable it).
kubelet_enabled() {
  systemctl is-enabled --quiet kubelet || tool "systemctl enable kubelet" systemctl enable kubelet
}

join() {
  local token="${PGC_JOIN_TOKEN:-}" hash="${PGC_CA_CERT_HASH:-}" api
  # Checked without echoing them: a malformed value is named, never shown.
  [[ "$token" =~ ^[a-z0-9]{6}\.[a-z0-9]{16}$ ]] || fail "join token" "[a-z0-9]{6}.[a-z0-9]{16}" "a malformed value"
  [[ "$hash" =~ ^sha256:[a-f0-9]{64}$ ]] || fail "CA cert hash" "sha256:<64 hex digits>" "a malformed value"
  # v1beta4 is served from kubeadm 1.31 (v1beta3 is deprecated there).
  api="kubeadm.k8s.io/v1beta4"
  ((10#$minor < 31)) && api="kubeadm.k8s.io/v1beta3"
  mkdir -p "$ROOT/run"
  # The pid in the name: the next run removes a file whose run was killed (guest_begin).
  JOIN_CONFIG="$(umask 077 && mktemp "$ROOT/run/pgc-join.$$.XXXXXX")"
  trap 'rm -f "$JOIN_CONFIG"' EXIT
  cat >"$JOIN_CONFIG" <<EOF
apiVersion: $api
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: "$api_endpoint"
    token: "$token"
    caCertHashes: ["$hash"]
nodeRegistration:
  name: "$node_name"
  criSocket: unix:///run/containerd/containerd.sock
EOF
  local out rc=0
  out="$(kubeadm join --config "$JOIN_CONFIG" 2>&1)" || rc=$?
  if ((rc)) && grep -q 'could not find a JWS signature in the cluster-info ConfigMap' <<<"$out"; then
    # The controller manager signs cluster-info for each bootstrap token (bootstrapsigner) and deletes a token
    # when it expires (kubeadm cmd/kubeadm/app/discovery/token/token.go): a join long after its token was made
    # finds no signature. The token itself is never printed.
    fail "kubeadm join" "a bootstrap token the API server holds" "none with this token's id (expired: a token the \
join-token step minted lives 1 h, so replace that step with 'pulumi up --replace <URN of ${node_name}'s *-join-token \
step>' (pulumi stack --show-urns); a kubeadmJoinToken secret lives 24 h unless made with another --ttl: run \
'kubeadm token create --ttl 2h' on a control-plane node, set the secret to what it prints and run pulumi up again)"
  fi
  ((rc == 0)) || fail_output "$out" "kubeadm join" "exit 0" "$rc"
  printf '%s\n' "$out"
  echo "join: joined as $node_name"
}

# join_leftovers: what a join that failed after its preflight checks leaves (and fails the next one's preflight).
join_leftovers() {
  local f
  for f in /etc/kubernetes/bootstrap-kubelet.conf /etc/kubernetes/pki/ca.crt; do
    [[ -e "$ROOT$f" ]] && return 0
  done
  return 1
}

main() {
  guest_begin
  swap_off
  kernel_prerequisites
  install_kubernetes
  hold "${PACKAGES[@]}"
  kubelet_enabled
  if [[ -f "$ROOT$KUBELET_CONF" ]]; then
    echo "join: already joined ($KUBELET_CONF exists)"
    return 0
  fi
  if join_leftovers; then
    echo "join: clearing the leftovers of a join that did not finish (kubeadm reset -f)"
    tool "kubeadm reset -f" kubeadm reset -f >/dev/null
  fi
  join
}

main "$@" </dev/null
