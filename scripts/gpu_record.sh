#!/usr/bin/env bash
# Record chapters on the GPU machine, then run the GPU tests there, in one call.
#
#   OUT=/some/folder bash scripts/gpu_record.sh [chapter ...]     # default: every chapter
#   GPU_TESTS=0 OUT=... bash scripts/gpu_record.sh ...             # record only, no GPU tests
#
# That machine has python3 with torch but no Jupyter packages and no network: they are
# installed from the wheels in .whl/ (see ../shared/gpu/fetch-wheels.sh) into /tmp/site.
# Results in $OUT: record.log (progress, failing cells with their tracebacks, the summary,
# the GPU tests) and recorded.tgz (book/_recorded; unpack it at the repository root:
# `tar xzf recorded.tgz`). Exit code 0 only if every chapter recorded and the tests passed.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$OUT"
log="$OUT/record.log"
: > "$log"

export PYTHONPATH="/tmp/site:$PWD/code${PYTHONPATH:+:$PYTHONPATH}"  # no pip install -e there
export PYTHONUNBUFFERED=1
if ! python3 -c "import nbclient, nbformat, jupytext, ipykernel, myst_nb" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    2>&1 | tee -a "$log"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$log"

python3 -m gpuinfer.record "$@" 2>&1 | tee -a "$log"
record_rc=${PIPESTATUS[0]}

if [ "${GPU_TESTS:-1}" = "0" ]; then
  echo "GPU tests skipped (GPU_TESTS=0)" | tee -a "$log"
  test_rc=0
elif python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -m gpu -v -p no:cacheprovider 2>&1 | tee -a "$log"
  test_rc=${PIPESTATUS[0]}
else
  echo "pytest is not installed here: add its wheels to .whl (fetch-wheels.sh pytest)" \
    | tee -a "$log"
  test_rc=1
fi

tar czf "$OUT/recorded.tgz" --exclude=".*.tmp" book/_recorded
echo "record: exit $record_rc; GPU tests: exit $test_rc; $(du -sh book/_recorded | cut -f1) in book/_recorded" \
  | tee -a "$log"
[ "$record_rc" -eq 0 ] && [ "$test_rc" -eq 0 ]
