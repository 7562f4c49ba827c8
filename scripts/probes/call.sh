#!/usr/bin/env bash
# One device call: record on the book's H200, or run the probes on any other card.
#   bash scripts/probes/call.sh "<chapters>" "<probe commands, ';'-separated>"
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card ($(date -u +%H:%M:%S) UTC)"
case "$card" in
  *H200*) OUT=$OUT GPU_TESTS=${GPU_TESTS:-0} bash scripts/gpu_record.sh $1 ;;
  *) export PYTHONPATH=code; bash -c "$2" 2>&1 | tee "$OUT/probes.txt" ;;
esac
echo "done ($(date -u +%H:%M:%S) UTC)"
