#!/usr/bin/env bash
# The package as it was at a commit, importable beside today's as `gpuinfer_old`
# (.probe/gpuinfer_old, ignored): for probes that time old and new code in the same rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."
commit=${1:?usage: old_package.sh COMMIT}
rm -rf .probe/gpuinfer_old && mkdir -p .probe/tmp
git archive "$commit" code/gpuinfer | tar -x -C .probe/tmp
mv .probe/tmp/code/gpuinfer .probe/gpuinfer_old && rm -rf .probe/tmp
grep -rl "gpuinfer" .probe/gpuinfer_old --include=*.py | xargs sed -i \
    -e 's/\bfrom gpuinfer\b/from gpuinfer_old/g' -e 's/\bimport gpuinfer\b/import gpuinfer_old/g' \
    -e 's/"gpuinfer\./"gpuinfer_old./g'
echo "gpuinfer at $commit: .probe/gpuinfer_old"
