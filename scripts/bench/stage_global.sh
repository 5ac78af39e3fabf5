#!/usr/bin/env bash
# Staging the global plan of Qwen3-235B-A22B (4,8,dp,16) -> (8,16,dp/4,8),
# ZeRO-1, at 128 to 16,384 ranks (DP scaled as scripts/bench/plan_rank.sh
# does): wall time, CPU time and peak memory of
# `vps-stage --budget 4GiB PLAN -o FILE` (best of RUNS, default 3), with the
# size of the staged file; with --doc, the table replaces the stage-global
# section of docs/BENCHMARKS.md and the cost per rank that of docs/plan.md.
# Target at 16,384 ranks: 5 s and 1 GB.
#   scripts/bench/stage_global.sh [--doc] [WORLDS...]
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && { doc=1; shift; }
worlds=${*:-128 1024 4096 16384}
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
rows=() per=() last=
for W in $worlds; do
	scripts/bench/qwen235b-layouts.sh "$W" "$t/a" "$t/b"
	bin/vps-plan "$t/a" "$t/b" -o "$t/plan"
	best=
	for ((i = 0; i < ${RUNS:-3}; i++)); do
		/usr/bin/time -f '%e %U %S %M' -o "$t/time" bin/vps-stage --budget 4GiB "$t/plan" -o "$t/staged"
		read -r wall user sys kb < "$t/time"
		if [ -z "$best" ] || awk -v a="$wall" -v b="${best%% *}" 'BEGIN { exit !(a < b) }'; then
			best="$wall $user $sys $kb"
		fi
	done
	read -r wall user sys kb <<<"$best"
	per+=("$(awk -v W="$W" -v u="$user" -v s="$sys" -v k="$kb" -v f="$(stat -c %s "$t/staged")" \
		'BEGIN { printf "| %d | %.1f KB | %.2f ms | %.0f B |", W, k / W, (u + s) * 1000 / W, f / W }')")
	rows+=("$(awk -v W="$W" -v w="$wall" -v u="$user" -v s="$sys" -v k="$kb" -v p="$(stat -c %s "$t/plan")" \
		-v f="$(stat -c %s "$t/staged")" 'BEGIN { printf "| %d | %.1f MB | %.2f s (%.2f s CPU) | %.0f MB | %.1f MB |", W, p / 1e6, w, u + s, k / 1024, f / 1e6 }')")
	echo "${rows[-1]}"
	last="$W $wall $user $sys $kb"
done
table() {
	echo "\`scripts/bench/stage_global.sh\` ($(nproc) CPUs, best of ${RUNS:-3}; load average $(cut -d' ' -f1-3 /proc/loadavg) at the end):"
	echo
	echo "| ranks | plan file | \`vps-stage --budget 4GiB\` | peak memory | staged file |"
	echo "|---:|---:|---|---:|---:|"
	printf '%s\n' "${rows[@]}"
	echo
	read -r W wall user sys kb <<<"$last"
	# on a shared machine the wall time waits for others; the CPU time
	# over the CPUs is the least it could be here
	awk -v W="$W" -v w="$wall" -v u="$user" -v s="$sys" -v n="$(nproc)" -v k="$kb" 'BEGIN {
		c = u + s
		printf "At %d ranks: %.2f s (%.2f s CPU, at least %.2f s on %d idle CPUs) against the target of 5 s (%s), %.0f MB against 1 GB (%s).\n",
			W, w, c, c / n, n, w <= 5 ? "met" : "not met", k / 1024, k <= 1024 * 1024 ? "met" : "not met" }'
}
per_rank() {
	echo "Measured by \`scripts/bench/stage_global.sh\` (\`vps-stage --budget 4GiB\` of the global plan,"
	echo "$(nproc) CPUs): per rank of the world, the peak memory, the CPU time and the staged file."
	echo
	echo "| ranks | memory per rank | CPU per rank | staged file per rank |"
	echo "|---:|---:|---:|---:|"
	printf '%s\n' "${per[@]}"
}
if [ "$doc" = 1 ]; then
	table | scripts/bench/doc-section.sh stage-global docs/BENCHMARKS.md
	per_rank | scripts/bench/doc-section.sh stage-global-per-rank docs/plan.md
fi
