#!/usr/bin/env bash
# One rank's whole path to a switch, with nothing of the world's: its plan
# (vps-plan --rank), its staged plan (vps-stage of that one-rank plan) and
# its verification (vps-verify), for Qwen3-235B-A22B (4,8,dp,16) ->
# (8,16,dp/4,8), ZeRO-1, at the paper's 128 ranks and with DP grown to
# 16,384 ranks. Runs both sizes alternately RUNS times (default 10) and
# reports the median of each step (wall time, and peak memory from GNU
# time) and the
# ratio 16,384 / 128; with --doc, writes the table into docs/BENCHMARKS.md.
#   scripts/bench/rank_path.sh [--doc]
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && doc=1
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
for w in 128 16384; do
	scripts/bench/qwen235b-layouts.sh $w "$t/a$w" "$t/b$w"
done
declare -A rank=([128]=${R128:-77} [16384]=${R16K:-9877})
measure() { # NAME COMMAND...: appends "NAME seconds kilobytes" to $t/times
	local name=$1 t0 t1
	shift
	t0=$EPOCHREALTIME
	/usr/bin/time -f "%M" -o "$t/kb" "$@" > /dev/null
	t1=$EPOCHREALTIME
	echo "$name $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }') $(cat "$t/kb")" >> "$t/times"
}
for ((i = 0; i < ${RUNS:-10}; i++)); do
	for w in 128 16384; do
		r=${rank[$w]}
		measure "plan.$w" bin/vps-plan "$t/a$w" "$t/b$w" --rank "$r" -o "$t/p$w"
		measure "stage.$w" bin/vps-stage --budget 4GiB "$t/p$w" -o "$t/s$w"
		measure "verify.$w" bin/vps-verify -q "$t/s$w"
	done
done
table() {
	echo "| step | 128 ranks (rank ${rank[128]}) | 16,384 ranks (rank ${rank[16384]}) | ratio |"
	echo "|---|---:|---:|---:|"
	awk '
		function median(list, n,   a, i, j, x) {
			n = split(list, a, " ")
			for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		{ split($1, k, "."); s[$1] = s[$1] " " $2; m[$1] = m[$1] " " $3 }
		END {
			n = split("plan stage verify", steps, " ")
			for (i = 1; i <= n; i++) {
				ka = steps[i] ".128"; kb = steps[i] ".16384"
				ta = median(s[ka]); tb = median(s[kb]); ma = median(m[ka]); mb = median(m[kb])
				tsa += ta; tsb += tb; mxa = ma > mxa ? ma : mxa; mxb = mb > mxb ? mb : mxb
				printf "| %s | %.0f ms, %.1f MB | %.0f ms, %.1f MB | %.2f |\n", steps[i], ta * 1000, ma / 1024, tb * 1000, mb / 1024, (ta > 0 ? tb / ta : 0)
			}
			printf "| **whole path** (sum; most memory) | %.0f ms, %.1f MB | %.0f ms, %.1f MB | %.2f |\n", tsa * 1000, mxa / 1024, tsb * 1000, mxb / 1024, (tsa > 0 ? tsb / tsa : 0)
		}' "$t/times"
}
table
[ "$doc" = 1 ] && { scripts/bench/doc-stamp.sh "RUNS=${RUNS:-10} scripts/bench/rank_path.sh --doc"; echo; table; } |
	scripts/bench/doc-section.sh rank-path docs/BENCHMARKS.md
exit 0
