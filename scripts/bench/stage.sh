#!/usr/bin/env bash
# Staging the paper's largest transitions: time to stage a global plan
# (hyperfine), and copy operations before and after merging.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
budget=${BUDGET:-4GiB}
cmds=()
echo "| transition | budget | stages | transfers | copies before merging | after | ratio | peak per rank |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for n in ${TRANSITIONS:-qwen3-235b-s13-s14 qwen3-235b-s14-s13 llama2-70b-s5-s6 llama2-70b-s6-s5 llama2-13b-ablation-s1-s2 llama2-13b-ablation-s2-s1 gpt3-6.7b-migrate}; do
	bin/vps-plan --transition "$n" -o "$t/$n.plan"
	bin/vps-stage --budget "$budget" "$t/$n.plan" --stats | awk -v n="$n" -v b="$budget" '
		{ v[$1] = $2 }
		END { printf "| %s | %s | %s | %s | %s | %s | %s | %.2f GB |\n", n, b, v["stages:"], v["transfers:"],
			v["copies_before_merging:"], v["copies_after_merging:"], v["merge_ratio:"], v["peak_max:"] / 1e9 }'
	cmds+=("bin/vps-stage --budget $budget $t/$n.plan -o $t/out")
done
echo
hyperfine -N --warmup 1 --runs "${RUNS:-5}" --export-markdown "${OUT:-/dev/stdout}" "${cmds[@]:0:3}" >/dev/null
cat "${OUT:-/dev/stdout}" 2>/dev/null || true
