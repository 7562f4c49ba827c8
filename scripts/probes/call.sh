#!/usr/bin/env bash
# One device call: record chapters on the card that came, or run probes on it.
#   bash scripts/probes/call.sh "<chapters>" ""                   # record (GPU_TESTS as in gpu_record.sh)
#   bash scripts/probes/call.sh "" "<probe commands, ';'-separated>"
# Never land a mix of cards: record all six chapters on one (NOTES-device-plan.md).
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card ($(date -u +%H:%M:%S) UTC)"
if [ -n "$1" ]; then
  OUT=$OUT GPU_TESTS=${GPU_TESTS:-0} bash scripts/gpu_record.sh $1
else
  export PYTHONPATH=code; bash -c "$2" 2>&1 | tee "$OUT/probes.txt"
fi
echo "done ($(date -u +%H:%M:%S) UTC)"
