#!/usr/bin/env bash
# Install the test dependencies (Python and system packages) and run the whole test suite.
# Idempotent; used as-is by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use: a real Prometheus and promtool, headless Chromium and its driver, and nginx (the
# gateway benchmark's bare relay, benchmarks/gateway_overhead.py --nginx).
# Debian installs nginx to /usr/sbin, which a user's PATH may lack.
export PATH="$PATH:/usr/sbin"
if ! command -v promtool >/dev/null || ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null \
  || ! command -v nginx >/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  had_package=no
  dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "ok installed" && had_package=yes
  # shellcheck source=scripts/prometheus_pids.sh
  . scripts/prometheus_pids.sh
  running_before=$(prometheus_pids)
  nginx_before=$(prometheus_pids nginx)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    prometheus chromium chromium-driver nginx-light >/dev/null
  # Debian's package starts a Prometheus service where it can; the tests start their own. Stop only what this
  # install started: the packaged unit (when this script installed the package), and new processes by pid;
  # a Prometheus that was running before is the user's and is left alone.
  if [ "$had_package" = no ] && command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    $SUDO systemctl stop prometheus || true
  fi
  stop_new_prometheus "$running_before"
  # Debian's nginx package starts its service where it can, as Prometheus's does: the same care.
  if command -v systemctl >/dev/null && systemctl is-active --quiet nginx 2>/dev/null && [ -z "$nginx_before" ]; then
    $SUDO systemctl stop nginx || true
  fi
  stop_new_prometheus "$nginx_before" nginx
fi

VENV=${LABKUBE_TEST_VENV:-.venv-test}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'
# An editable install leaves labkube's modules uncompiled; where PYTHONDONTWRITEBYTECODE is set (many CI images)
# every process the tests start would compile them again. Compiled once here, as `pip install .` does.
"$VENV/bin/python" benchmarks/as_installed.py

# Gaia2 worlds run Meta's ARE in a virtualenv of its own (cached under ~/.cache/labkube).
"$VENV/bin/labkube" worlds setup
# --agent claude-code / codex: the vendors' CLIs from npm at their pinned versions (cached under ~/.cache/labkube).
"$VENV/bin/labkube" agents install

export RAY_AUTH_MODE=disabled
# `pytest` (not `python -m pytest`): the checkout's operator/ folder must not shadow the stdlib module.
# the 20 slowest tests are printed at the end of every run: where the time goes.
# Three test processes (pytest-xdist), a test file to each at a time: most of the suite waits (on Ray, operators,
# worlds, CLIs and the processes they start), so three share 2 cores well; a file's module fixtures stay in one
# process. `-n 0` after this command's name runs it in one process.
exec "$VENV/bin/pytest" -q --durations=20 -n 3 --dist loadfile "$@"
