#!/usr/bin/env bash
# Pack and unpack against memcpy (scripts/bench/pack_bench.c) on bench-170m:
# a TP change (strided boxes: the fc1 [gate; up] halves, row-parallel
# columns) and a data-parallel change (whole shards, merged).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" && make -s all build/bench/pack_bench
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
M=scripts/bench/models/bench-170m.yaml
for pair in "tp=2,dp=1:tp=1,dp=2" "tp=1,dp=2,zero=1:tp=1,dp=3,zero=1"; do
	bin/vps-layout --model $M --parallel "${pair%%:*}" -o "$t/a"
	bin/vps-layout --model $M --parallel "${pair#*:}" -o "$t/b"
	bin/vps-plan "$t/a" "$t/b" | bin/vps-stage --budget "${BUDGET:-256MiB}" - -o "$t/s"
	echo "== ${pair%%:*} -> ${pair#*:}, rank 1"
	build/bench/pack_bench "$t/s" 1 "${RUNS:-7}"
done
