#!/usr/bin/env bash
# One rank's plan for Qwen3-235B-A22B (4,8,4,16) -> (8,16,1,8) at the paper's
# 128 ranks, next to the same transition with DP grown to 16,384 ranks
# ((4,8,512,16) -> (8,16,128,8)). Whole-process time of vps-plan --rank.
# With --doc, writes the table into docs/BENCHMARKS.md (section plan-rank).
#   [RUNS=N] [R128=R] [R16K=R] scripts/bench/plan_rank.sh [--doc]
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && doc=1
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
scripts/bench/qwen235b-layouts.sh 128 "$t/a128" "$t/b128"
scripts/bench/qwen235b-layouts.sh 16384 "$t/a16k" "$t/b16k"
R128=${R128:-77} R16K=${R16K:-9877}
cmds=("bin/vps-plan $t/a128 $t/b128 --rank $R128 -o $t/out"
	"bin/vps-plan $t/a16k $t/b16k --rank $R16K -o $t/out")
if [ "$doc" = 0 ]; then
	hyperfine -N --warmup 3 --runs "${RUNS:-20}" --export-markdown "${OUT:-/dev/stdout}" "${cmds[@]}"
	exit 0
fi
hyperfine -N --warmup 3 --runs "${RUNS:-20}" --export-json "$t/h.json" "${cmds[@]}" > "$t/log"
{
	scripts/bench/doc-stamp.sh "RUNS=${RUNS:-20} scripts/bench/plan_rank.sh --doc"
	echo
	echo "| world | rank | mean | range |"
	echo "|---:|---:|---:|---:|"
	jq -r --arg r1 "$R128" --arg r2 "$R16K" '["128 | \($r1)", "16,384 | \($r2)"] as $w | .results | to_entries[] |
		"| \($w[.key]) | \(.value.mean*1e4|round/10) ms ± \(.value.stddev*1e4|round/10) | \(.value.min*1e4|round/10) – \(.value.max*1e4|round/10) ms |"' "$t/h.json"
	echo
	jq -r '"Ratio 16,384 / 128: \(.results[1].mean / .results[0].mean * 100 | round / 100)x (target: at most 1.5x, and at most 50 ms each)."' "$t/h.json"
} | scripts/bench/doc-section.sh plan-rank docs/BENCHMARKS.md
echo "wrote the plan-rank section of docs/BENCHMARKS.md"
