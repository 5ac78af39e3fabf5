#!/usr/bin/env bash
# One rank's whole path to a switch, with nothing of the world's: its plan
# (vps-plan --rank), its staged plan (vps-stage of that one-rank plan) and
# its verification (vps-verify), for Qwen3-235B-A22B (4,8,dp,16) ->
# (8,16,dp/4,8), ZeRO-1, at the paper's 128 ranks and with DP grown to
# 16,384 and 65,536 ranks. Runs the sizes in turn RUNS times (default 10)
# and reports the median of each step (wall time, and peak memory from GNU
# time), the ratio of each larger world's to 128's and, last, each larger
# world's verdict against the targets: the whole path within 1.5x of
# 128's, and within 100 ms and 64 MB. The plans are vps-plan's default
# (relays where they win; no device joins here, so none relays). With
# --doc, writes the table into docs/BENCHMARKS.md.
#   scripts/bench/rank_path.sh [--doc]
# WORLDS= picks the worlds (multiples of 128, the first 128; default
# "128 16384 65536"), R128=, R16K= and R64K= their ranks (77, 9877, 39877).
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && doc=1
read -r -a worlds <<< "${WORLDS:-128 16384 65536}"
[ "${worlds[0]}" = 128 ] || { echo "rank_path.sh: WORLDS: the first is 128, the base of the ratios" >&2; exit 2; }
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
declare -A rank=([128]=${R128:-77} [16384]=${R16K:-9877} [65536]=${R64K:-39877})
for w in "${worlds[@]}"; do
	[ -n "${rank[$w]:-}" ] || rank[$w]=$((w / 2 + 77))
	scripts/bench/qwen235b-layouts.sh "$w" "$t/a$w" "$t/b$w"
done
measure() { # NAME COMMAND...: appends "NAME seconds kilobytes" to $t/times
	local name=$1 t0 t1
	shift
	t0=$EPOCHREALTIME
	/usr/bin/time -f "%M" -o "$t/kb" "$@" > /dev/null
	t1=$EPOCHREALTIME
	echo "$name $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f", b - a }') $(cat "$t/kb")" >> "$t/times"
}
for ((i = 0; i < ${RUNS:-10}; i++)); do
	for w in "${worlds[@]}"; do
		r=${rank[$w]}
		measure "plan.$w" bin/vps-plan "$t/a$w" "$t/b$w" --rank "$r" -o "$t/p$w"
		measure "stage.$w" bin/vps-stage --budget 4GiB "$t/p$w" -o "$t/s$w"
		measure "verify.$w" bin/vps-verify -q "$t/s$w"
	done
done
table() {
	local ranks=() w
	for w in "${worlds[@]}"; do ranks+=("${rank[$w]}"); done
	awk -v worlds="${worlds[*]}" -v ranks="${ranks[*]}" '
		function median(list, n,   a, i, j, x) {
			n = split(list, a, " ")
			for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function group(n,   s, i) { s = sprintf("%d", n); for (i = length(s) - 3; i > 0; i -= 3) s = substr(s, 1, i) "," substr(s, i + 1); return s }
		{ s[$1] = s[$1] " " $2; m[$1] = m[$1] " " $3 }
		END {
			nw = split(worlds, W, " ")
			split(ranks, R, " ")
			head = "| step |"; rule = "|---|"
			for (k = 1; k <= nw; k++) { head = head " " group(W[k]) " ranks (rank " R[k] ") |"; rule = rule "---:|" }
			for (k = 2; k <= nw; k++) { head = head " " group(W[k]) " / 128 |"; rule = rule "---:|" }
			print head
			print rule
			n = split("plan stage verify", steps, " ")
			for (i = 1; i <= n; i++) {
				line = "| " steps[i] " |"
				for (k = 1; k <= nw; k++) {
					key = steps[i] "." W[k]
					t[k] = median(s[key]); mem = median(m[key])
					sum[k] += t[k]; most[k] = mem > most[k] ? mem : most[k]
					line = line sprintf(" %.0f ms, %.1f MB |", t[k] * 1000, mem / 1024)
				}
				for (k = 2; k <= nw; k++)
					line = line sprintf(" %.2f |", t[1] > 0 ? t[k] / t[1] : 0)
				print line
			}
			line = "| **whole path** (sum; most memory) |"
			for (k = 1; k <= nw; k++)
				line = line sprintf(" %.0f ms, %.1f MB |", sum[k] * 1000, most[k] / 1024)
			for (k = 2; k <= nw; k++)
				line = line sprintf(" %.2f |", sum[1] > 0 ? sum[k] / sum[1] : 0)
			print line
			print ""
			for (k = 2; k <= nw; k++) {
				ratio = sum[1] > 0 ? sum[k] / sum[1] : 0
				printf "At %s ranks: the whole path %.2fx the same at 128 (target: at most 1.5x: %s); %.0f ms and %.1f MB (target: at most 100 ms and 64 MB: %s).\n",
					group(W[k]), ratio, ratio <= 1.5 ? "met" : "**not met**", sum[k] * 1000, most[k] / 1024,
					sum[k] <= 0.1 && sum[1] <= 0.1 && most[k] <= 64 * 1024 && most[1] <= 64 * 1024 ? "met" : "**not met** on this machine"
			}
		}' "$t/times"
}
table
[ "$doc" = 1 ] && { scripts/bench/doc-stamp.sh "RUNS=${RUNS:-10} scripts/bench/rank_path.sh --doc"; echo; table; } |
	scripts/bench/doc-section.sh rank-path docs/BENCHMARKS.md
exit 0
