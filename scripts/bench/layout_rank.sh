#!/usr/bin/env bash
# One rank's sub-VPS of Qwen3-235B-A22B: the paper's (4,8,4,16) at 128 ranks
# next to the same configuration with DP grown to 512 (16,384 ranks). The
# per-rank cost must not depend on the world size. With --doc, writes the
# table into docs/BENCHMARKS.md (section layout-rank).
#   [RUNS=N] scripts/bench/layout_rank.sh [--doc]
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && doc=1
make -s all
P=tp=4,pp=8,ep=16,etp=1,first=11,last=11,zero=1
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
small="bin/vps-layout --model qwen3-235b-a22b --parallel $P,dp=4 --rank 77 -o $t/out"
large="bin/vps-layout --model qwen3-235b-a22b --parallel $P,dp=512 --rank 9877 -o $t/out"
if [ "$doc" = 0 ]; then
	hyperfine -N --warmup 3 --runs "${RUNS:-30}" --export-markdown "${OUT:-/dev/stdout}" "$small" "$large"
	exit 0
fi
hyperfine -N --warmup 3 --runs "${RUNS:-30}" --export-json "$t/h.json" "$small" "$large" > "$t/log"
{
	scripts/bench/doc-stamp.sh "RUNS=${RUNS:-30} scripts/bench/layout_rank.sh --doc"
	echo
	echo "| world | rank | mean | range |"
	echo "|---:|---:|---:|---:|"
	jq -r '["128 | 77", "16,384 | 9877"] as $w | .results | to_entries[] |
		"| \($w[.key]) | \(.value.mean*1e4|round/10) ms ± \(.value.stddev*1e4|round/10) | \(.value.min*1e4|round/10) – \(.value.max*1e4|round/10) ms |"' "$t/h.json"
	echo
	jq -r '"Ratio 16,384 / 128: \(.results[1].mean / .results[0].mean * 100 | round / 100)."' "$t/h.json"
} | scripts/bench/doc-section.sh layout-rank docs/BENCHMARKS.md
echo "wrote the layout-rank section of docs/BENCHMARKS.md"
