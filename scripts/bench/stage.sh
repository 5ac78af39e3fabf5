#!/usr/bin/env bash
# Staging the paper's largest transitions: time to stage a global plan
# (hyperfine), and copy operations before and after merging. With --doc,
# writes both tables into docs/BENCHMARKS.md (section stage).
#   [RUNS=N] [BUDGET=SIZE] [TRANSITIONS="..."] scripts/bench/stage.sh [--doc]
set -euo pipefail
cd "$(dirname "$0")/../.."
doc=0
[ "${1:-}" = --doc ] && doc=1
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
budget=${BUDGET:-4GiB}
names=()
cmds=()
table() {
	echo "| transition | budget | stages | transfers | copies before merging | after | ratio | peak per rank |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|"
	for n in ${TRANSITIONS:-qwen3-235b-s13-s14 qwen3-235b-s14-s13 llama2-70b-s5-s6 llama2-70b-s6-s5 llama2-13b-ablation-s1-s2 llama2-13b-ablation-s2-s1 gpt3-6.7b-migrate}; do
		bin/vps-plan --transition "$n" -o "$t/$n.plan"
		bin/vps-stage --budget "$budget" "$t/$n.plan" --stats | awk -v n="$n" -v b="$budget" '
			{ v[$1] = $2 }
			END { printf "| %s | %s | %s | %s | %s | %s | %s | %.2f GB |\n", n, b, v["stages:"], v["transfers:"],
				v["copies_before_merging:"], v["copies_after_merging:"], v["merge_ratio:"], v["peak_max:"] / 1e9 }'
	done
}
if [ "$doc" = 0 ]; then
	table
	for n in ${TRANSITIONS:-qwen3-235b-s13-s14 qwen3-235b-s14-s13 llama2-70b-s5-s6}; do
		cmds+=("bin/vps-stage --budget $budget $t/$n.plan -o $t/out")
	done
	echo
	# the markdown goes to a file first: reading back /dev/stdout hangs on a pipe
	hyperfine -N --warmup 1 --runs "${RUNS:-5}" --export-markdown "${OUT:-$t/times.md}" "${cmds[@]:0:3}" > "$t/log"
	cat "${OUT:-$t/times.md}"
	exit 0
fi
table > "$t/table"
# The time of the first three transitions' staging (the largest plans).
for n in ${TRANSITIONS:-qwen3-235b-s13-s14 qwen3-235b-s14-s13 llama2-70b-s5-s6}; do
	names+=("$n")
	cmds+=("bin/vps-stage --budget $budget $t/$n.plan -o $t/out")
done
hyperfine -N --warmup 1 --runs "${RUNS:-5}" --export-json "$t/h.json" "${cmds[@]:0:3}" > "$t/log"
{
	scripts/bench/doc-stamp.sh "RUNS=${RUNS:-5} scripts/bench/stage.sh --doc"
	echo
	cat "$t/table"
	echo
	echo "| transition | staging time (whole process) | range |"
	echo "|---|---:|---:|"
	printf '%s\n' "${names[@]:0:3}" | jq -R . | jq -s . > "$t/names.json"
	jq -r --slurpfile n "$t/names.json" '.results | to_entries[] |
		"| \($n[0][.key]) | \(.value.mean*1e3|round) ms ± \(.value.stddev*1e3|round) | \(.value.min*1e3|round) – \(.value.max*1e3|round) ms |"' "$t/h.json"
} | scripts/bench/doc-section.sh stage docs/BENCHMARKS.md
echo "wrote the stage section of docs/BENCHMARKS.md"
