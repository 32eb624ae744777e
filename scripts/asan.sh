#!/usr/bin/env bash
# The C extensions built with AddressSanitizer and UndefinedBehaviorSanitizer, and the tests that feed
# them untrusted bytes (the codec, model reader, tree kernel, TreeSHAP and fuzz tests) run against that build.
#
#   bash scripts/asan.sh                                # the default selection below (not the slow tier)
#   bash scripts/asan.sh -m slow tests/test_c_fuzz.py   # or any pytest arguments: here the long fuzz runs
#
# The package, its tests and setup.py are copied to a temporary directory and the sanitized extensions
# built there (the worktree's own .so files are not touched); pytest runs in that copy (so nothing
# of the worktree is imported) with libasan and libubsan preloaded into the uninstrumented
# interpreter. CPython keeps memory until exit by design, so leak detection is off. Exits non-zero
# when pytest fails or when any sanitizer report appears in the output (kept in $ASAN_LOG, default
# build/asan.log). Not part of .ci/run: it takes minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=python3
LOG=${ASAN_LOG:-$ROOT/build/asan.log}
mkdir -p "$(dirname "$LOG")"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/forestflow-asan.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cp -r forestflow tests bench setup.py pyproject.toml "$WORK/"
find "$WORK" \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +
cd "$WORK"

SANITIZE="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
echo "building the sanitized extensions in $WORK"
CFLAGS="$SANITIZE" LDFLAGS="-fsanitize=address,undefined" "$PYTHON" setup.py -q build_ext --inplace >/dev/null

LIBS="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export PYTHONPATH="$WORK" LD_PRELOAD="$LIBS" PYTHONMALLOC=malloc
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:print_stacktrace=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# The extensions must be the sanitized ones, or this run proves nothing.
"$PYTHON" -c "
import sys
import forestflow.codecs._ffjson as a, forestflow.codecs._ffgp as b, forestflow.codecs._ffwire as c
import forestflow.predlog._kafka_records as d, forestflow.runtime._h2o_trees as e
import forestflow.runtime._forest as f, forestflow.runtime._treeshap as g, forestflow.predlog._jsonl as h
import forestflow.api._ffhttp as i
bad = [m.__file__ for m in (a, b, c, d, e, f, g, h, i) if not m.__file__.startswith('$WORK/')]
sys.exit('not the sanitized build: ' + ', '.join(bad) if bad else 0)"

if [ $# -eq 0 ]; then
  set -- -m "not slow" tests/test_c_fuzz.py tests/codecs tests/runtime/test_h2o_invalid.py \
    tests/api_gp/test_graphpipe_codec.py tests/api_gp/test_graphpipe_c_strings.py \
    tests/predlog/test_kafka_batch.py tests/predlog/test_encode_protobuf.py tests/predlog/test_jsonl_line.py \
    tests/predlog/test_graphpipe_events.py tests/predlog/test_encode_golden.py tests/predlog/test_usual_entry.py \
    tests/runtime/test_h2o_native.py tests/runtime/test_h2o_padded.py tests/runtime/test_tree_engine.py tests/runtime/test_treeshap.py -k "not genmodel and not jvm and not java and not auto and not calibrated"
fi
echo "running pytest $* under ASan/UBSan (log: $LOG)"
status=0
"$PYTHON" -m pytest -q -n 0 -p no:cacheprovider "$@" >"$LOG" 2>&1 || status=$?
tail -n 3 "$LOG"
if grep -Eq 'ERROR: AddressSanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior)Sanitizer' "$LOG"; then
  echo "sanitizer reports found (see $LOG):"
  grep -E -m 20 'ERROR: AddressSanitizer|runtime error:|SUMMARY:' "$LOG"
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "pytest failed under the sanitizers (exit $status): see $LOG"
  exit "$status"
fi
echo "clean: no sanitizer report"
