#!/usr/bin/env bash
# Makes ./.venv-mlserver with the MLServer of scripts/mlserver-requirements.txt (the RemoteV2 tests'
# upstream V2 server). Idempotent: when the venv holds exactly these requirements it returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-mlserver
REQS=scripts/mlserver-requirements.txt
if [ -x "$VENV/bin/mlserver" ] && cmp -s "$REQS" "$VENV/requirements.installed"; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -r "$REQS"
cp "$REQS" "$VENV/requirements.installed"
