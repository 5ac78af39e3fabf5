#!/usr/bin/env bash
# The global plan of Qwen3-235B-A22B (4,8,dp,16) -> (8,16,dp/4,8), zero=1, at
# 128, 1,024, 4,096 and 16,384 ranks (plan_rank.sh's transition, DP grown):
# wall time, CPU time and peak resident memory (/usr/bin/time -v) of
# `vps-plan --stats` and `vps-plan -o FILE`, the best of RUNS runs, and what
# the global plan costs per rank. Writes its tables into docs/BENCHMARKS.md
# and docs/plan.md between their plan-global markers (or prints them with
# PRINT=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
RUNS=${RUNS:-3}
SIZES=${SIZES:-"128 1024 4096 16384"}

# measure NAME CMD...: best wall of RUNS runs -> "wall cpu rss_kb"
measure() {
	local best="" line
	for ((i = 0; i < RUNS; i++)); do
		/usr/bin/time -v -o "$t/time" "$@" > "$t/stdout"
		line=$(awk -F': ' '
			/Elapsed \(wall clock\)/ { n = split($2, p, ":"); w = 0; for (k = 1; k <= n; k++) w = w * 60 + p[k] }
			/User time/ { u = $2 } /System time/ { s = $2 } /Maximum resident/ { m = $2 }
			END { printf "%.2f %.2f %d\n", w, u + s, m }' "$t/time")
		if [ -z "$best" ] || awk -v a="$line" -v b="$best" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[1] < y[1]) }'; then
			best=$line
		fi
	done
	echo "$best"
}

rows=() per=()
for s in $SIZES; do
	W=$s
	scripts/bench/qwen235b-layouts.sh "$W" "$t/a" "$t/b"
	read -r sw sc sm <<<"$(measure bin/vps-plan "$t/a" "$t/b" --stats)"
	pieces=$(awk '$1 == "pieces:" { print $2 }' "$t/stdout")
	world=$(awk '$1 == "world:" { print $2 }' "$t/stdout")
	[ "$world" = "$W" ] || { echo "plan_global.sh: dp=$da gives $world ranks, not $W" >&2; exit 1; }
	read -r ow oc om <<<"$(measure bin/vps-plan "$t/a" "$t/b" -o "$t/plan")"
	bytes=$(stat -c %s "$t/plan")
	rows+=("$(awk -v W="$W" -v sw="$sw" -v sc="$sc" -v sm="$sm" -v ow="$ow" -v oc="$oc" -v om="$om" -v n="$pieces" -v b="$bytes" 'BEGIN {
		printf "| %d | %d | %.2f s (%.2f s CPU), %d MB | %.2f s (%.2f s CPU), %d MB | %.1f MB |", W, n, sw, sc, sm / 1024, ow, oc, om / 1024, b / 1e6 }')")
	per+=("$(awk -v W="$W" -v oc="$oc" -v om="$om" -v n="$pieces" -v b="$bytes" 'BEGIN {
		printf "| %d | %.0f | %.0f B | %.1f KB | %.2f ms |", W, n / W, b / W, om / W, oc / W * 1000 }')")
done

# the balance of the last (largest) world's plan on the paper's testbed,
# planned without relays (the balance target is the direct planner's): the
# busiest device within 1.10x of the balanced bound, or the estimate within
# 1.02x of the time bound; beside it the default plan's estimate, against
# the direct one and its relayed floor (one run each; not timed)
bin/vps-plan "$t/a" "$t/b" --stats --topology a800-testbed --no-relay -q > "$t/balance"
bin/vps-plan "$t/a" "$t/b" --stats --topology a800-testbed -q > "$t/default"
balance=$(awk -v W="$W" 'FNR == NR && $1 == "busiest_over_bound:" { b = $2 } FNR == NR && $1 == "estimate_over_time_bound:" { e = $2 }
	FNR == NR && $1 == "estimate_seconds:" { d = $2 }
	FNR != NR && $1 == "estimate_seconds:" { s = $2 } FNR != NR && $1 == "estimate_over_relayed_time_floor:" { r = $2 }
	END { printf "At %d ranks on a800-testbed, planned without relays (--no-relay): the busiest device %.3fx the balanced bound, the estimate %.3fx the time bound (target: within 1.10x of the one or 1.02x of the other: %s). By default (relays where they win): the estimate %.4f s against %.4f s without relays (%.2fx faster), %.3fx its relayed floor.", W, b, e, (b <= 1.10 || e <= 1.02) ? "met" : "not met", s, d, d / s, r }' "$t/balance" "$t/default")

load=$(cut -d' ' -f1-3 /proc/loadavg)
main=$(
	echo "Measured by \`scripts/bench/plan_global.sh\` on $(nproc) CPUs (load average $load when it ended),"
	echo "best wall time of $RUNS runs, with the CPU time (user + system) and the peak resident memory of that"
	echo "run; \`vps-plan\` uses a thread per online CPU."
	echo
	echo "| ranks | pieces | \`vps-plan --stats\` | \`vps-plan -o FILE\` | plan file |"
	echo "|---:|---:|---|---|---:|"
	printf '%s\n' "${rows[@]}"
	echo
	echo "$balance"
)
rank=$(
	echo "Measured by \`scripts/bench/plan_global.sh\` (\`vps-plan -o FILE\`, $(nproc) CPUs): per rank of"
	echo "the world, the pieces, the plan file's bytes, the peak resident memory and the CPU time."
	echo
	echo "| ranks | pieces per rank | file per rank | memory per rank | CPU per rank |"
	echo "|---:|---:|---:|---:|---:|"
	printf '%s\n' "${per[@]}"
)

# put FILE NAME TEXT: replace what lies between <!-- NAME:begin --> and <!-- NAME:end -->
put() {
	grep -q "<!-- $2:begin -->" "$1" && grep -q "<!-- $2:end -->" "$1" ||
		{ echo "plan_global.sh: $1 has no <!-- $2:begin/end --> markers" >&2; exit 1; }
	awk -v name="$2" -v text="$3" '
		$0 == "<!-- " name ":begin -->" { print; print text; skip = 1; next }
		$0 == "<!-- " name ":end -->" { skip = 0 }
		!skip' "$1" > "$t/doc"
	cat "$t/doc" > "$1"
}
if [ -n "${PRINT:-}" ]; then
	printf '%s\n\n%s\n' "$main" "$rank"
else
	put docs/BENCHMARKS.md plan-global "$main"
	put docs/plan.md plan-global-per-rank "$rank"
fi
