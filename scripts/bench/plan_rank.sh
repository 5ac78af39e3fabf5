#!/usr/bin/env bash
# One rank's plan for Qwen3-235B-A22B (4,8,4,16) -> (8,16,1,8) at the paper's
# 128 ranks, next to the same transition with DP grown to 16,384 ranks
# ((4,8,512,16) -> (8,16,128,8)). Whole-process time of vps-plan --rank.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
scripts/bench/qwen235b-layouts.sh 128 "$t/a128" "$t/b128"
scripts/bench/qwen235b-layouts.sh 16384 "$t/a16k" "$t/b16k"
R128=${R128:-77} R16K=${R16K:-9877}
hyperfine -N --warmup 3 --runs "${RUNS:-20}" --export-markdown "${OUT:-/dev/stdout}" \
	"bin/vps-plan $t/a128 $t/b128 --rank $R128 -o $t/out" \
	"bin/vps-plan $t/a16k $t/b16k --rank $R16K -o $t/out"
