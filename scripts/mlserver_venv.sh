#!/usr/bin/env bash
# Makes ./.venv-mlserver with the MLServer of scripts/mlserver-requirements.txt (the RemoteV2 tests'
# upstream V2 server). Idempotent: when the venv holds exactly these requirements it returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-mlserver
REQS=scripts/mlserver-requirements.txt
current() { [ -x "$VENV/bin/mlserver" ] && cmp -s "$REQS" "$VENV/requirements.installed"; }
current && exit 0
# Several test processes may get here at once (pytest -n, each fixture calls this): one installs.
exec 9>".venv-mlserver.lock"
flock 9
current && exit 0
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r "$REQS"
cp "$REQS" "$VENV/requirements.installed"
