#!/usr/bin/env bash
# Pack and unpack against memcpy (scripts/bench/pack_bench.c) on bench-170m:
# a TP change (strided boxes: the fc1 [gate; up] halves, row-parallel
# columns) and a data-parallel change (whole shards, merged). With --doc,
# writes the table into docs/BENCHMARKS.md (section pack).
#   [RUNS=N] [BUDGET=SIZE] scripts/bench/pack.sh [--doc]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
doc=0
[ "${1:-}" = --doc ] && doc=1
cd "$top" && make -s all build/bench/pack_bench
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
M=scripts/bench/models/bench-170m.yaml
pairs=("tp=2,dp=1:tp=1,dp=2" "tp=1,dp=2,zero=1:tp=1,dp=3,zero=1")
names=("tp=2 -> tp=1,dp=2 (strided boxes)" "dp=2 -> dp=3, ZeRO-1 (whole shards)")
for i in "${!pairs[@]}"; do
	pair=${pairs[$i]}
	bin/vps-layout --model $M --parallel "${pair%%:*}" -o "$t/a"
	bin/vps-layout --model $M --parallel "${pair#*:}" -o "$t/b"
	bin/vps-plan "$t/a" "$t/b" | bin/vps-stage --budget "${BUDGET:-256MiB}" - -o "$t/s"
	if [ "$doc" = 0 ]; then
		echo "== ${pair%%:*} -> ${pair#*:}, rank 1"
		build/bench/pack_bench "$t/s" 1 "${RUNS:-7}"
	else
		build/bench/pack_bench "$t/s" 1 "${RUNS:-7}" > "$t/out.$i"
	fi
done
[ "$doc" = 1 ] || exit 0
{
	scripts/bench/doc-stamp.sh "RUNS=${RUNS:-7} scripts/bench/pack.sh --doc"
	echo
	echo "| change | direction | bytes | vps | memcpy | ratio |"
	echo "|---|---|---:|---:|---:|---:|"
	for i in "${!pairs[@]}"; do
		# pack_bench prints "pack:   N MB, X GB/s, memcpy Y GB/s, ratio R".
		awk -v n="${names[$i]}" -F'[:,]' '
			/^(pack|unpack):/ {
				d = $1; sub(/^ +/, "", $2); sub(/^ +/, "", $3); sub(/^ *memcpy /, "", $4); sub(/^ *ratio /, "", $5)
				printf "| %s | %s | %.0f MB | %s | %s | %s |\n", (d == "pack" ? n : ""), d, $2 + 0, $3, $4, $5 }' "$t/out.$i"
	done
} | scripts/bench/doc-section.sh pack docs/BENCHMARKS.md
echo "wrote the pack section of docs/BENCHMARKS.md"
