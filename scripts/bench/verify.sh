#!/usr/bin/env bash
# vps-verify on staged plans: the rows of issue #11 (the README's example,
# the largest paper transitions, Qwen3-30B at two budgets) and one rank's
# staged plan of Qwen3-235B at 128 and at 16,384 ranks. Whole process time
# (median of RUNS runs) and peak RSS (the largest of them), both from
# /usr/bin/time; the section between the verify markers of
# docs/BENCHMARKS.md is replaced by what this run measured.
#
# One rank's staged plan is made the way a rank makes it
# (vps-plan --rank R | vps-stage) where vps-stage takes a one-rank plan;
# otherwise from the global plan (vps-stage --rank R), whose file then
# carries the global plan: the "made from" column says which.
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s all
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
runs=${RUNS:-3}
doc=${DOC:-docs/BENCHMARKS.md}

# measure NAME FILE: verify FILE runs times; prints "seconds kilobytes"
measure() {
	local i
	for ((i = 0; i < runs; i++)); do
		/usr/bin/time -f '%e %M' -o "$t/time" bin/vps-verify -q "$2" > "$t/out" 2>&1 || {
			echo "$1: vps-verify failed:" >&2
			cat "$t/out" >&2
			exit 1
		}
		cat "$t/time"
	done | sort -n | awk -v n="$runs" '{ s[NR] = $1; if ($2 > m) m = $2 } END { print s[int((n + 1) / 2)], m }'
}

rows=()
# row LABEL FILE TARGET_S TARGET_MB MADE_FROM
row() {
	local m sec kb mb ok
	m=$(measure "$1" "$2")
	sec=${m% *}
	kb=${m#* }
	mb=$(awk -v k="$kb" 'BEGIN { printf "%.0f", k / 1024 }')
	ok=$(awk -v s="$sec" -v m="$mb" -v ts="$3" -v tm="$4" 'BEGIN { print (s <= ts && m <= tm) ? "yes" : "**no**" }')
	local size
	size=$(awk -v b="$(stat -c %s "$2")" 'BEGIN { printf "%.1f", b / 1e6 }')
	rows+=("| $1 | $5 | $size | $sec s | $mb MB | $3 s, $4 MB | $ok |")
	echo "${rows[-1]}"
}

# the README's pipeline
bin/vps-layout --model llama2-7b --parallel tp=2,pp=2,dp=2,zero=1 -o "$t/a7"
bin/vps-layout --model llama2-7b --parallel tp=4,pp=4,dp=1,zero=1 -o "$t/b7"
bin/vps-plan "$t/a7" "$t/b7" | bin/vps-stage --budget 2GiB - -o "$t/7b.staged"
row "LLaMA-2 7B (2,2,2) -> (4,4,1), 2GiB (README)" "$t/7b.staged" 10 1024 "global plan"
for spec in llama2-70b-s5-s6:4GiB:"LLaMA-2 70B s5 -> s6, 4GiB" \
	qwen3-30b-s11-s12:1GiB:"Qwen3-30B (4,8,1,4) -> (2,4,4,2), 1GiB" \
	qwen3-30b-s11-s12:64MiB:"Qwen3-30B (4,8,1,4) -> (2,4,4,2), 64MiB" \
	qwen3-235b-s13-s14:4GiB:"Qwen3-235B s13 -> s14, 4GiB"; do
	IFS=: read -r n budget label <<<"$spec"
	[ -e "$t/$n.plan" ] || bin/vps-plan --transition "$n" -o "$t/$n.plan"
	bin/vps-stage --budget "$budget" "$t/$n.plan" -o "$t/$n-$budget.staged"
	row "$label" "$t/$n-$budget.staged" 10 1024 "global plan"
done

# one rank's staged plan, Qwen3-235B (4,8,dp,16) -> (8,16,dp/4,8), zero=1
# (scripts/bench/plan_rank.sh's layouts)
M=qwen3-235b-a22b
A=tp=4,pp=8,ep=16,etp=1,first=11,last=11,zero=1
B=tp=8,pp=16,ep=8,etp=1,first=5,last=5,zero=1
for w in 128:4:1:77 16384:512:128:9877; do
	IFS=: read -r W dpa dpb R <<<"$w"
	bin/vps-layout --model $M --parallel $A,dp=$dpa -o "$t/a$W"
	bin/vps-layout --model $M --parallel $B,dp=$dpb -o "$t/b$W"
	# as a rank makes it: its own plan, staged alone
	bin/vps-plan "$t/a$W" "$t/b$W" --rank "$R" -o "$t/r$W.plan"
	bin/vps-stage --budget 4GiB "$t/r$W.plan" -o "$t/r$W.staged"
	target=10
	[ "$W" != 16384 ] || target=1
	row "Qwen3-235B, rank $R of $W, 4GiB" "$t/r$W.staged" $target 1024 "rank $R's plan"
	# cut from the global plan, which the file then carries
	bin/vps-plan "$t/a$W" "$t/b$W" -o "$t/g$W.plan"
	bin/vps-stage --budget 4GiB --rank "$R" "$t/g$W.plan" -o "$t/g$W.staged"
	rm -f "$t/g$W.plan"
	row "Qwen3-235B, rank $R of $W, 4GiB" "$t/g$W.staged" 10 1024 "global plan (carried)"
	rm -f "$t/g$W.staged"
done

{
	echo "\`scripts/bench/verify.sh\` (RUNS=$runs; whole process, median time, largest peak RSS;"
	echo "$(nproc) cores, $(date -u +%Y-%m-%d)): \`vps-verify\` on staged plans. \"made from\": the"
	echo "plan vps-stage staged. A rank's file made from its own plan (vps-plan --rank) holds"
	echo "its part alone; one cut from the global plan carries that plan, and reading it is"
	echo "most of the time: at 16,384 ranks that is the file a rank should not use."
	echo
	echo "| staged plan | made from | file MB | time | peak RSS | target | met |"
	echo "|---|---|---:|---:|---:|---|---|"
	printf '%s\n' "${rows[@]}"
} | scripts/bench/doc-section.sh verify "$doc"
echo "wrote the verify section of $doc"
