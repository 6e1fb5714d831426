"""What the fake ``qm`` scripts (fakekube's ``install_qm``, fakemig's ``install_vm``) share: ``qm guest exec`` and the
guest agent's availability, as qemu-server runs them. Source followed (qemu-server, ``src/PVE/CLI/qm.pm`` method
``exec`` and ``$print_agent_result``; ``src/PVE/QemuServer/Agent.pm`` ``assert_agent_available``,
``qemu_exec_status``):

- ``guest cmd``/``guest exec`` first assert the agent: ``No QEMU guest agent configured`` (no ``agent`` in the VM's
  config), ``VM <id> is not running``, ``QEMU guest agent is not running`` (its guest-ping got no answer), each a
  ``die``: the message on stderr and a non-zero exit (255 here, as PVE::CLIHandler's ``exit(-1)``).
- ``guest exec`` (synchronous, ``--timeout`` default 30, 0 = no limit) polls exec-status once a second; once the
  command exited it prints the status object (``exited`` 1, ``exitcode``, ``out-data``/``err-data`` decoded from
  base64, present only when not empty) as pretty, canonical JSON on stdout, exit 0 whatever the command's code.
- When the timeout is reached first it warns ``timeout reached, returning pid`` on stderr and prints the reply of
  guest-exec itself, ``{"pid": N}`` (no ``exited``, no ``exitcode``), still exit 0; the command runs on in the guest.

``FAKE_QM`` is Python source for the fake scripts: ``agent_gone(host, vmid, status)`` and ``guest_exec(...)``.
Knobs (files in the host's fake root): ``fake-no-agent`` (no agent configured), ``agent-dead`` (the agent does not
answer), ``fake-exec-timeout`` (seconds: the exec's limit instead of ``--timeout``, so a test reaches the timeout
without waiting for it).
"""

from __future__ import annotations

FAKE_QM = r'''
import json, os, subprocess, sys


def agent_gone(host, vmid, status):
    """assert_agent_available: exit as qm does when the guest agent cannot be reached, else return."""
    if os.path.exists(os.path.join(host, "fake-no-agent")):
        sys.exit(print("No QEMU guest agent configured", file=sys.stderr) or 255)
    if status != "running":
        sys.exit(print(f"VM {vmid} is not running", file=sys.stderr) or 255)
    if os.path.exists(os.path.join(host, "agent-dead")):
        sys.exit(print("QEMU guest agent is not running", file=sys.stderr) or 255)


def guest_exec(host, args, command, env, stdin=None):
    """qm guest exec <vmid> [--timeout N] [--pass-stdin 1] -- command...: the command (already mapped into the
    guest's fake root) runs; its result, or the timeout, as qm prints it. Exits."""
    options = args[: args.index("--")]
    limit = float(options[options.index("--timeout") + 1]) if "--timeout" in options else 30.0
    knob = os.path.join(host, "fake-exec-timeout")
    if os.path.exists(knob):
        limit = float(open(knob).read())
    proc = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(stdin or "", timeout=limit or None)
    except subprocess.TimeoutExpired:
        # The command runs on in the guest; qm returns what guest-exec answered.
        print("timeout reached, returning pid", file=sys.stderr)
        print(json.dumps({"pid": proc.pid}, indent=3, sort_keys=True))
        sys.exit(0)
    result = {"exitcode": proc.returncode, "exited": 1}
    if out:
        result["out-data"] = out
    if err:
        result["err-data"] = err
    print(json.dumps(result, indent=3, sort_keys=True))
    sys.exit(0)
'''
