"""The fake guest's containerd, nvidia-ctk and crictl (sh bodies for ``FakeRoot.stub_script``), modelled on
containerd 1.7 (Ubuntu 24.04's) and nvidia-ctk 1.18.2 (the toolkit version the project installs). Each behaviour
below is checked against the real binaries (built by tools/recipes/) in ``test_containerd_contract.py``:

- ``containerd config default`` prints a subset of 1.7's defaults, every value as 1.7 prints it (runc with
  ``SystemdCgroup = false``).
- ``containerd config dump`` and ``crictl info`` show the EFFECTIVE config: the main file (or the defaults) with its
  ``imports`` applied in order, where an imported file's plugin table REPLACES the whole table of that plugin
  (containerd 1.7 ``services/server/config/config.go`` mergeConfig: "Maps merged by keys, but values are replaced
  entirely"), the replaced table then decoded over the plugin's defaults (its ``runtimes`` map replaced as a
  whole): a drop-in holding only the nvidia runtime drops runc and the site's sandbox image.
- ``nvidia-ctk runtime configure --runtime=containerd`` (toolkit 1.18 ``pkg/config/engine/containerd``): reads
  ``/etc/containerd/config.toml`` (config source ``file``), copies its WHOLE CRI plugin table into the drop-in
  ``/etc/containerd/conf.d/99-nvidia.toml`` (getBaseDropInConfigTree), adds the nvidia runtime as a copy of the
  default (else runc's) runtime with ``options.BinaryName`` set, ``default_runtime_name`` with
  ``--set-as-default``, ``enable_cdi`` with ``--cdi.enabled``; then REWRITES config.toml with the drop-in folder in
  ``imports`` (re-serialised: comments are lost).
- ``nvidia-ctk cdi generate --output=F`` writes a spec (the real one needs NVML, i.e. a GPU and its driver).
"""

from __future__ import annotations

import sys

DEFAULT_CONTAINERD = """version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = false"""

# Python shared by the stubs: TOML out (tables after keys, keys sorted, as go-toml v1 writes them) and containerd's
# loading of a config with its imports.
_PY = (
    r"""import copy, glob, json, os, sys, tomllib
DEFAULT = '''"""
    + DEFAULT_CONTAINERD
    + r"""'''
def value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(value(x) for x in v) + "]"
    return json.dumps(v) if isinstance(v, str) else str(v)
def key(k):
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)
def dump(d, path=(), depth=0):
    out = []
    for k in sorted(d):
        if not isinstance(d[k], dict):
            out.append("  " * depth + key(k) + " = " + value(d[k]))
    for k in sorted(d):
        if isinstance(d[k], dict):
            p = path + (key(k),)
            out += ["", "  " * depth + "[" + ".".join(p) + "]"] + dump(d[k], p, depth + 1)
    return out
def over(table, default):
    # A plugin's config struct keeps its defaults where the table is silent; a map (runtimes) is replaced.
    out = copy.deepcopy(table)
    for k, v in default.items():
        if k not in out:
            out[k] = copy.deepcopy(v)
        elif isinstance(v, dict) and isinstance(out[k], dict) and k != "runtimes":
            out[k] = over(out[k], v)
    return out
def load(etc):
    # The effective config of the files in etc (laid out as /etc/containerd), as containerd loads them.
    main = os.path.join(etc, "config.toml")
    defaults = tomllib.loads(DEFAULT)["plugins"]
    cfg = tomllib.load(open(main, "rb")) if os.path.exists(main) else tomllib.loads(DEFAULT)
    for pattern in cfg.get("imports", []):
        for path in sorted(glob.glob(os.path.join(etc, pattern.removeprefix("/etc/containerd/")))):
            for k, v in tomllib.load(open(path, "rb")).items():
                if k == "plugins":  # whole plugin tables replaced, then decoded over the plugin's defaults
                    for name, table in v.items():
                        cfg.setdefault("plugins", {})[name] = over(table, defaults.get(name, {}))
                elif k != "imports":
                    cfg[k] = v
    return cfg
"""
)

CONTAINERD = (
    r"""if [ "$2" = default ]; then cat <<'EOF'
"""
    + DEFAULT_CONTAINERD
    + r"""
EOF
exit 0; fi
"""
    + sys.executable
    + r""" - "$R/etc/containerd" <<'EOF'
"""
    + _PY
    + r"""print("\n".join(dump(load(sys.argv[1]))).strip())
EOF"""
)

CRICTL = (
    r"""[ -f "$D/cri-tools" ] || { echo "crictl: command not found" >&2; exit 127; }
if [ ! -d "$R/fake-running/containerd" ]; then
  echo 'FATA[0000] validate service connection: validate CRI v1 runtime API for endpoint "unix:///run/containerd/containerd.sock": rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: no such file or directory"' >&2
  exit 1
fi
"""
    + sys.executable
    + r""" - "$R/fake-running/containerd" <<'EOF'
"""
    + _PY
    + r"""cfg = load(sys.argv[1])  # the files containerd was (re)started with
cri = cfg.get("plugins", {}).get("io.containerd.grpc.v1.cri", {})
ctd = cri.get("containerd", {})
runtimes = {n: {"runtimeType": r.get("runtime_type", ""), "options": r.get("options", {})}
            for n, r in ctd.get("runtimes", {}).items()}
config = {"containerd": {"defaultRuntimeName": ctd.get("default_runtime_name", "runc"), "runtimes": runtimes},
          "enableCDI": bool(cri.get("enable_cdi", False)), "sandboxImage": cri.get("sandbox_image", "")}
print(json.dumps({"status": {"conditions": []}, "config": config}, indent=2))
EOF"""
)

NVIDIA_CTK = (
    r"""if [ "$1" = cdi ]; then out="${3#--output=}"; echo "cdiVersion: 0.5.0" > "$out"; exit 0; fi
"""
    + sys.executable
    + r""" - "$R" "$@" <<'EOF'
"""
    + _PY
    + r"""root, args = sys.argv[1], sys.argv[2:]
main = root + "/etc/containerd/config.toml"
cfg = tomllib.load(open(main, "rb")) if os.path.exists(main) else {}
version = cfg.get("version", 1 if cfg else 2)
if version == 1:
    sys.exit("fake nvidia-ctk: a version 1 config (no drop-ins) is not modelled")
name = "io.containerd.grpc.v1.cri" if version == 2 else "io.containerd.cri.v1.runtime"
cri = copy.deepcopy(cfg.get("plugins", {}).get(name, {}))
ctd = cri.setdefault("containerd", {})
runtimes = ctd.setdefault("runtimes", {})
default = ctd.get("default_runtime_name", "")
template = next((runtimes[r] for r in ([default] if default and not default.startswith("nvidia") else []) +
                 ["runc", "crun"] if r in runtimes), {"runtime_type": "io.containerd.runc.v2"})
runtimes["nvidia"] = copy.deepcopy(template)
runtimes["nvidia"].setdefault("options", {})["BinaryName"] = "/usr/bin/nvidia-container-runtime"
if "--set-as-default" in args:
    ctd["default_runtime_name"] = "nvidia"
elif default == "nvidia":
    del ctd["default_runtime_name"]
if "--cdi.enabled" in args:
    cri["enable_cdi"] = True
os.makedirs(root + "/etc/containerd/conf.d", exist_ok=True)
with open(root + "/etc/containerd/conf.d/99-nvidia.toml", "w") as f:
    f.write("\n".join(dump({"version": version, "plugins": {name: cri}})).strip())
imports = cfg.get("imports", [])
if "/etc/containerd/conf.d/*.toml" not in imports:
    cfg["imports"] = imports + ["/etc/containerd/conf.d/*.toml"]
with open(main, "w") as f:
    f.write("\n".join(dump(cfg)).strip())
EOF"""
)
