"""The install script for a machine: cloud-init user-data, or run as-is over SSH.

It needs only ``/bin/sh`` and ``python3`` (>= 3.9): Python itself downloads the zipapp and
checks its SHA-256 (no curl or wget needed). Over HTTPS the download trusts the server's CA
the script carries (``SERVER_CA``, also written into the agent's config), and only it. It
converges: running it again replaces the zipapp and the config and restarts the agent, never
starting a second one.

Overridable from the environment (for non-root installs and tests): ``GRAPHENE_AGENT_PREFIX``,
``GRAPHENE_AGENT_CONF_DIR``, ``GRAPHENE_AGENT_STATE_DIR``, ``GRAPHENE_AGENT_PYTHON`` and
``GRAPHENE_AGENT_NO_SYSTEMD=1``.
"""

from __future__ import annotations

import shlex

TEMPLATE = r"""#!/bin/sh
# Graphene agent installer for agent {agent_name_comment}.
# Usable as cloud-init user-data, or run as root (or any user) on the machine.
# It holds a single-use bootstrap token: treat it as a secret until the agent has connected.
set -eu
umask 077

SERVER={server}
SERVER_CA={server_ca}
PYZ_SHA256={sha256}

if [ "$(id -u)" = 0 ]; then
  PREFIX="${{GRAPHENE_AGENT_PREFIX:-/opt/graphene-agent}}"
  CONF_DIR="${{GRAPHENE_AGENT_CONF_DIR:-/etc/graphene-agent}}"
  STATE_DIR="${{GRAPHENE_AGENT_STATE_DIR:-/var/lib/graphene-agent}}"
else
  PREFIX="${{GRAPHENE_AGENT_PREFIX:-$HOME/.local/share/graphene-agent}}"
  CONF_DIR="${{GRAPHENE_AGENT_CONF_DIR:-$HOME/.config/graphene-agent}}"
  STATE_DIR="${{GRAPHENE_AGENT_STATE_DIR:-$HOME/.local/state/graphene-agent}}"
fi
PY="${{GRAPHENE_AGENT_PYTHON:-$(command -v python3 || true)}}"
if [ -z "$PY" ] || ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
  echo "graphene-agent install: python3 >= 3.9 is required" >&2
  exit 1
fi

mkdir -p "$PREFIX" "$CONF_DIR" "$STATE_DIR"
chmod 700 "$CONF_DIR" "$STATE_DIR"

# Download and verify with Python itself.
"$PY" - "$SERVER/agents/download" "$PREFIX/.graphene-agent.pyz.tmp" "$PYZ_SHA256" "$SERVER_CA" <<'GRAPHENE_PY'
import base64, hashlib, ssl, sys, urllib.request
url, dest, want, server_ca = sys.argv[1:5]
context = None
if server_ca:
    context = ssl.create_default_context(cadata=b"".join(base64.b64decode(c) for c in server_ca.split(",")))
with urllib.request.urlopen(url, timeout=120, context=context) as response:
    data = response.read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit("graphene-agent install: checksum mismatch for %s: got %s, expected %s" % (url, got, want))
with open(dest, "wb") as out:
    out.write(data)
GRAPHENE_PY
chmod 755 "$PREFIX/.graphene-agent.pyz.tmp"
mv -f "$PREFIX/.graphene-agent.pyz.tmp" "$PREFIX/graphene-agent.pyz"

CONF="$CONF_DIR/agent.env"
cat > "$CONF.tmp" <<'GRAPHENE_ENV'
{env_file}GRAPHENE_ENV
echo "GRAPHENE_AGENT_STATE_DIR=$STATE_DIR" >> "$CONF.tmp"
chmod 600 "$CONF.tmp"
mv -f "$CONF.tmp" "$CONF"

if [ "$(id -u)" = 0 ] && [ -z "${{GRAPHENE_AGENT_NO_SYSTEMD:-}}" ] && [ -d /run/systemd/system ] \
   && command -v systemctl >/dev/null 2>&1; then
  cat > /etc/systemd/system/graphene-agent.service <<GRAPHENE_UNIT
[Unit]
Description=Graphene agent (outbound-only; listens on no port)
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=$PY $PREFIX/graphene-agent.pyz --config $CONF
Restart=always
RestartSec=5
# 78: refused for good (revoked, foreign or used credential, deleted record); 2: bad config.
RestartPreventExitStatus=78 2

[Install]
WantedBy=multi-user.target
GRAPHENE_UNIT
  systemctl daemon-reload
  systemctl enable graphene-agent.service
  systemctl restart graphene-agent.service
  echo "graphene-agent: started by systemd (graphene-agent.service)"
else
  PIDFILE="$STATE_DIR/agent.pid"
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    i=0
    while kill -0 "$(cat "$PIDFILE")" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
  fi
  if command -v setsid >/dev/null 2>&1; then DETACH=setsid; else DETACH=; fi
  # shellcheck disable=SC2086
  nohup $DETACH "$PY" "$PREFIX/graphene-agent.pyz" --config "$CONF" >> "$STATE_DIR/agent.log" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  echo "graphene-agent: started in the background (pid $(cat "$PIDFILE"), log $STATE_DIR/agent.log)"
fi
"""


def render_install_script(
    *, server_url: str, pyz_sha256: str, env_file: str, agent_name: str, server_ca: str = ""
) -> str:
    if "GRAPHENE_ENV" in env_file:  # would end the here-document early
        raise ValueError("the env file must not contain the here-document delimiter")
    return TEMPLATE.format(
        server=shlex.quote(server_url),
        server_ca=shlex.quote(server_ca),
        sha256=shlex.quote(pyz_sha256),
        env_file=env_file if env_file.endswith("\n") else env_file + "\n",
        agent_name_comment=" ".join(agent_name.split())[:100],
    )


# Where the cloud-config form writes the script: /run is a tmpfs, so the token in it never
# reaches the disk, and the script removes itself once it ran.
CLOUD_INIT_SCRIPT = "/run/graphene-agent-install.sh"


def render_cloud_config(*, install_script: str, agent_name: str) -> str:
    """The install script as ``#cloud-config`` user-data (``write_files`` + ``runcmd``), to
    merge with other cloud-config; the script alone is user-data too."""
    content = "".join(f"      {line}\n" if line else "\n" for line in install_script.splitlines())
    name = " ".join(agent_name.split())[:100]
    return (
        "#cloud-config\n"
        f"# Graphene agent {name}: installs and starts graphene-agent, which dials out to Graphene.\n"
        "# It holds a single-use bootstrap token: treat it as a secret until the agent has connected.\n"
        "write_files:\n"
        f"  - path: {CLOUD_INIT_SCRIPT}\n"
        '    permissions: "0700"\n'
        "    owner: root:root\n"
        "    content: |\n"
        f"{content}"
        "runcmd:\n"
        f'  - [sh, -c, "sh {CLOUD_INIT_SCRIPT}; status=$?; rm -f {CLOUD_INIT_SCRIPT}; exit $status"]\n'
    )
