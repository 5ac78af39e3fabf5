#!/usr/bin/env bash
# The executors' agreement on stage boundaries (vps_net_allreduce): W
# ranks as threads over loopback, each all-reducing three numbers per XOR
# step, as vps-exec does before a switch. Prints the busiest rank's bytes
# next to the formula of docs/plan.md, (floor(log2 W) + [W not a power of
# two]) x (24 (steps + 1) + 16), and for a relayed plan, whose forward steps
# take a second all-reduce, x (24 (4 steps + 1) + 32) with hops up to 3; both formulas at
# 16,384 ranks; with --doc, writes
# the table into docs/BENCHMARKS.md. The largest world here is bounded by
# the open files one process may hold (every connection has both ends in
# this process).
#   scripts/bench/agree.sh [--doc] [WORLDS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && { doc=1; shift; }
worlds=${*:-128 1000 1024}
make -s build/tests/test_net
out=$(VPS_AGREE_WORLDS="$worlds" build/tests/test_net)
table() {
	echo "| world | steps | busiest rank's bytes, measured | formula | relayed plan (3 hops), measured | formula |"
	echo "|---:|---:|---:|---:|---:|---:|"
	echo "$out" | awk '$1 == "agree:" { printf "| %\047d | %\047d | %\047d | %\047d | %\047d | %\047d |\n", $3, $5, $7, $9, $11, $13 }'
	# the formulas where a process cannot hold the whole world
	awk 'BEGIN { W = 16384; s = 16383; printf "| %\047d | %\047d | (not run here) | %\047d | (not run here) | %\047d |\n", W, s,
		14 * (24 * (s + 1) + 16), 14 * (24 * (4 * s + 1) + 32) }'
}
if echo "$out" | grep -q '^FAIL'; then
	echo "$out" >&2
	exit 1
fi
table
[ "$doc" = 1 ] && { scripts/bench/doc-stamp.sh "scripts/bench/agree.sh --doc $worlds"; echo; table; } |
	scripts/bench/doc-section.sh agree docs/BENCHMARKS.md
exit 0
