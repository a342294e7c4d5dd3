#!/usr/bin/env bash
# Install the test dependencies (Python and system packages) and run the whole test suite.
# Idempotent; used as-is by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use: a real Prometheus and promtool, headless Chromium and its driver.
if ! command -v promtool >/dev/null || ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    prometheus chromium chromium-driver >/dev/null
fi
# Debian's package starts a Prometheus service where it can; the tests start their own.
pkill -x prometheus 2>/dev/null || true

VENV=${LABKUBE_TEST_VENV:-.venv-test}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test]'

# Gaia2 worlds run Meta's ARE in a virtualenv of its own (cached under ~/.cache/labkube).
"$VENV/bin/labkube" worlds setup
# --agent claude-code / codex: the vendors' CLIs from npm at their pinned versions (cached under ~/.cache/labkube).
"$VENV/bin/labkube" agents install

export RAY_AUTH_MODE=disabled
# `pytest` (not `python -m pytest`): the checkout's operator/ folder must not shadow the stdlib module.
exec "$VENV/bin/pytest" -q "$@"
