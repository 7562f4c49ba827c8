#!/usr/bin/env bash
# Record chapters on the GPU machine, and run the GPU tests there, in one call.
#
#   OUT=/some/folder bash scripts/gpu_record.sh [chapter ...]     # default: every chapter
#   GPU_TESTS=0 OUT=... bash scripts/gpu_record.sh ...             # record only, no GPU tests
#   GPU_TESTS=first OUT=... bash scripts/gpu_record.sh ...         # the GPU tests first; record
#                                                                  # only if they pass
#   ALLOW_CPU=1 GPU_TESTS=0 OUT=... bash scripts/gpu_record.sh ... # try it on a CPU: smoke
#                                                                  # recordings (--allow-cpu)
#
# OUT is checked first (a relative OUT is taken from the folder you run this from): nothing
# runs unless a file can be written there. That machine has python3 with torch but no
# Jupyter packages and no network: they are installed from the wheels in .whl/ (see
# ../shared/gpu/fetch-wheels.sh) into /tmp/site. Results in $OUT: record.log (progress,
# failing cells with their tracebacks, each chapter's seconds, the GPU tests) and, for each
# chapter as soon as it is recorded, <chapter>.tgz (its recording and artifacts:
# book/_recorded/<chapter>.ipynb and book/_recorded/<chapter>/), written under a temporary
# name and renamed once whole, so that a call cut short still brings back every chapter it
# finished and never half of one. Unpack one at the repository root with
# `rm -rf book/_recorded/<chapter> && tar xzf <chapter>.tgz` (the folder first: an artifact
# the new run did not write would otherwise stay, and make the recording read as stale). A
# chapter that fails brings back nothing (its previous recording stays as it was). Exit code
# 0 only if every chapter recorded and the tests passed; 2 for a bad OUT, or for no CUDA GPU
# (said first, before anything is installed) unless ALLOW_CPU=1.
set -uo pipefail

fail_usage() { echo "error: $*" >&2; exit 2; }

# A GPU first, before anything is checked, installed or recorded: without one the record
# command would refuse every chapter, after the wheels were installed.
if [ "${ALLOW_CPU:-0}" != "1" ]; then
  case "$(python3 -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null)" in
    1) ;;
    0) fail_usage "no CUDA GPU is visible here (torch.cuda.is_available() is False): run" \
         "this on the GPU machine (check nvidia-smi and CUDA_VISIBLE_DEVICES), or set" \
         "ALLOW_CPU=1 for CPU smoke recordings (--allow-cpu; the tests reject them)" ;;
    *) fail_usage "python3 cannot import torch here, so no CUDA GPU can be used: run this" \
         "on the GPU machine, whose python3 has torch" ;;
  esac
fi

[ -n "${OUT:-}" ] || fail_usage "set OUT to the folder whose files come back, e.g." \
  "OUT=/tmp/out bash scripts/gpu_record.sh"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac  # relative: from the caller's folder
repo=$(cd "$(dirname "$0")/.." && pwd -P)
case "$(realpath -m "$OUT")/" in "$repo/book/"*)
  fail_usage "OUT=$OUT is inside the book ($repo/book); set OUT to a folder outside it" ;;
esac
mkdir -p "$OUT" 2>/dev/null && OUT=$(cd "$OUT" && pwd -P) \
  || fail_usage "OUT=$OUT is not a folder that can be made here; set OUT to a writable folder"
probe=$(mktemp "$OUT/.write-check.XXXXXX" 2>/dev/null) \
  || fail_usage "OUT=$OUT is not writable; set OUT to a folder you can write into"
rm -f "$probe"

cd "$repo"
log="$OUT/record.log"
: > "$log"

export PYTHONPATH="/tmp/site:$PWD/code${PYTHONPATH:+:$PYTHONPATH}"  # no pip install -e there
export PYTHONUNBUFFERED=1
if ! python3 -c "import nbclient, nbformat, jupytext, ipykernel, myst_nb" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    2>&1 | tee -a "$log"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$log"

# The chapters as stems, in the TOC's order; a bad name or an unreadable TOC stops here with
# the record command's one-line message.
if ! listed=$(python3 -c '
import sys
from pathlib import Path
from gpuinfer.publish.preflight import UsageError, select_chapters
try:
    print("\n".join(select_chapters(Path(".").resolve(), sys.argv[1:])))
except UsageError as exc:
    sys.exit(f"error: {exc}")
' "$@" 2>&1); then
  echo "$listed" | tee -a "$log" >&2
  exit 2
fi
mapfile -t chapters <<< "$listed"

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

flags=()
[ "${ALLOW_CPU:-0}" = "1" ] && flags+=(--allow-cpu)
record_rc=0
for stem in "${chapters[@]}"; do
  start=$SECONDS
  if python3 -m gpuinfer.publish.record "${flags[@]}" "$stem" 2>&1 | tee -a "$log"; then
    parts=("book/_recorded/$stem.ipynb")
    [ -d "book/_recorded/$stem" ] && parts+=("book/_recorded/$stem")
    if tar czf "$OUT/.$stem.tgz.tmp" "${parts[@]}" && mv "$OUT/.$stem.tgz.tmp" "$OUT/$stem.tgz"
    then
      echo "[$stem] recorded in $((SECONDS - start)) s: $OUT/$stem.tgz" | tee -a "$log"
    else
      rm -f "$OUT/.$stem.tgz.tmp"
      record_rc=1
      echo "[$stem] recorded in $((SECONDS - start)) s, but $OUT/$stem.tgz could not be" \
        "written; the recording is in book/_recorded/ on this machine" | tee -a "$log"
    fi
  else
    record_rc=1
    echo "[$stem] FAILED after $((SECONDS - start)) s: nothing brought back" | tee -a "$log"
  fi
done

if [ "${GPU_TESTS:-1}" = "1" ]; then
  gpu_tests
  test_rc=$?
fi
size=$(du -sh book/_recorded 2>/dev/null | cut -f1)
echo "record: exit $record_rc; GPU tests: exit $test_rc; ${size:-nothing} in book/_recorded" \
  | tee -a "$log"
[ "$record_rc" -eq 0 ] && [ "$test_rc" -eq 0 ]
