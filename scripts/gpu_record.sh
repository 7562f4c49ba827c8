#!/usr/bin/env bash
# Record chapters on the GPU machine, and run the GPU tests there, in one call.
#
#   OUT=/some/folder bash scripts/gpu_record.sh [chapter ...]     # default: every chapter
#   GPU_TESTS=0 OUT=... bash scripts/gpu_record.sh ...             # record only, no GPU tests
#   GPU_TESTS=first OUT=... bash scripts/gpu_record.sh ...         # the GPU tests first; record
#                                                                  # only if they pass
#
# That machine has python3 with torch but no Jupyter packages and no network: they are
# installed from the wheels in .whl/ (see ../shared/gpu/fetch-wheels.sh) into /tmp/site.
# Results in $OUT: record.log (progress, failing cells with their tracebacks, each chapter's
# seconds, the GPU tests) and, for each chapter as soon as it is recorded, <chapter>.tgz (its
# recording and artifacts: book/_recorded/<chapter>.ipynb and book/_recorded/<chapter>/;
# unpack it at the repository root with `tar xzf <chapter>.tgz`), so that a call cut short
# still brings back every chapter it finished. A chapter that fails brings back nothing (its
# previous recording stays as it was). Exit code 0 only if every chapter recorded and the
# tests passed.
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

gpu_tests() {
  if python3 -c "import pytest" 2>/dev/null; then
    python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee -a "$log"
    return "${PIPESTATUS[0]}"
  fi
  echo "pytest is not installed here: add its wheels to .whl (fetch-wheels.sh pytest)" \
    | tee -a "$log"
  return 1
}

test_rc=0
if [ "${GPU_TESTS:-1}" = "first" ]; then
  gpu_tests
  test_rc=$?
  if [ "$test_rc" -ne 0 ]; then
    echo "GPU tests failed: nothing recorded" | tee -a "$log"
    exit 1
  fi
fi

chapters=("$@")
if [ "${#chapters[@]}" -eq 0 ]; then  # every chapter of the TOC, in its order
  mapfile -t chapters < <(python3 -c \
    "from gpuinfer.publish.recordings import chapters; print('\n'.join(chapters('.')))")
fi
record_rc=0
for chapter in "${chapters[@]}"; do
  start=$SECONDS
  if python3 -m gpuinfer.publish.record "$chapter" 2>&1 | tee -a "$log"; then
    stem=$(python3 -c 'import sys; from pathlib import Path
from gpuinfer.publish.record import select_chapters  # a prefix such as "01" -> the stem
print(*select_chapters(Path("."), sys.argv[1:]))' "$chapter")
    parts=("book/_recorded/$stem.ipynb")
    [ -d "book/_recorded/$stem" ] && parts+=("book/_recorded/$stem")
    tar czf "$OUT/$stem.tgz" "${parts[@]}"
    echo "[$chapter] recorded in $((SECONDS - start)) s: $OUT/$stem.tgz" | tee -a "$log"
  else
    record_rc=1
    echo "[$chapter] FAILED after $((SECONDS - start)) s: nothing brought back" | tee -a "$log"
  fi
done

if [ "${GPU_TESTS:-1}" = "1" ]; then
  gpu_tests
  test_rc=$?
fi
echo "record: exit $record_rc; GPU tests: exit $test_rc; $(du -sh book/_recorded | cut -f1) in book/_recorded" \
  | tee -a "$log"
[ "$record_rc" -eq 0 ] && [ "$test_rc" -eq 0 ]
