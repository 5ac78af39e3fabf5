#!/usr/bin/env bats
# docs/BENCHMARKS.md cannot drift from the code: every table in it lies in a
# section that a script writes (between <!-- NAME:begin --> and
# <!-- NAME:end -->), scripts/bench/run-all regenerates every such section,
# and the prose around them states no measured figure a rerun could
# contradict. Reads files only; runs no benchmark.

load helpers

DOC=$TOP/docs/BENCHMARKS.md

# names of the sections of FILE, in order, one a line
sections() {
	sed -n 's/^<!-- \([a-z0-9-]*\):begin -->$/\1/p' "$1"
}

@test "every table line of BENCHMARKS.md lies in a generated section, markers paired" {
	run awk '
		/^<!-- [a-z0-9-]+:begin -->$/ {
			n = $2; sub(/:begin$/, "", n)
			if (cur != "") { print FILENAME ":" NR ": section " n " opens inside " cur; bad = 1 }
			cur = n; next }
		/^<!-- [a-z0-9-]+:end -->$/ {
			n = $2; sub(/:end$/, "", n)
			if (n != cur) { print FILENAME ":" NR ": end of " n " closes " (cur == "" ? "nothing" : cur); bad = 1 }
			cur = ""; next }
		/^\|/ && cur == "" { print FILENAME ":" NR ": table line outside a generated section: " $0; bad = 1 }
		END { if (cur != "") { print FILENAME ": section " cur " never ends"; bad = 1 }; exit bad }' "$DOC"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	[ "$(sections "$DOC" | wc -l)" -ge 10 ]
}

@test "every section of BENCHMARKS.md is one a script in scripts/ writes" {
	local n bad=0
	for n in $(sections "$DOC"); do
		# doc-section.sh NAME FILE, plan_global.sh's put FILE NAME, or a
		# script that finds the markers itself
		grep -rqE "(doc-section\.sh\"? |put [^ ]+ )$n( |\$)|<!-- $n:begin -->" "$TOP/scripts" ||
			{ echo "no script writes section $n"; bad=1; }
	done
	[ "$bad" = 0 ]
}

@test "scripts/bench/run-all regenerates every section of BENCHMARKS.md" {
	run "$TOP/scripts/bench/run-all" --list
	[ "$status" -eq 0 ]
	local n bad=0
	for n in $(sections "$DOC"); do
		cut -f1 <<< "$output" | grep -qx "$n" || { echo "run-all does not write section $n"; bad=1; }
	done
	[ "$bad" = 0 ]
	run "$TOP/scripts/bench/run-all" no-such-section
	[ "$status" -eq 2 ]
}

# A measured figure: a number with a decimal point, or a number with a unit
# of time, size or rate, or a ratio (2.5x). Allowed outside the generated
# sections only on lines that state a target (the figure is the goal, not a
# measurement), in code blocks (commands), and on the lines below, each for
# the reason given.
ALLOW=(
	# the GPU's model name, in a heading
	'^[0-9]+: ## GPU execution \(one NVIDIA H100\)$'
	# the transitions' targets, continued from the line that says so
	'within 1\.10 of the balanced bound'
	'the estimate within 1\.02 of the time bound'
	# a ratio of exactly 1.000 is the definition of meeting a bound
	'is 1\.000 where the estimate|Where it is above 1\.000'
	# the testbed's links (configs/topologies), not a measurement
	'over a link 8x slower'
	# Megatron's row sizes and hidden sizes: properties of the models
	'rows of 2\.5-16 KiB'
)

@test "no measured figure in BENCHMARKS.md's prose outside the generated sections" {
	local allow
	allow=$(printf '%s\n' "${ALLOW[@]}")
	run awk '
		/^<!-- [a-z0-9-]+:begin -->$/ { gen = 1; next }
		/^<!-- [a-z0-9-]+:end -->$/ { gen = 0; next }
		/^```/ { code = !code; next }
		gen || code || /^    / || /[Tt]arget/ { next }
		{ print NR ": " $0 }' "$DOC"
	[ "$status" -eq 0 ]
	local hits
	# a figure starts a word: gpt3-1.3b and 0.19+ are names
	hits=$(grep -E '[ (~][0-9]+\.[0-9]|[ (~][0-9][0-9,]*(\.[0-9]+)? ?(s|ms|MB|GB|GB/s|x)\b' <<< "$output" |
		grep -vE "$(paste -sd'|' <<< "$allow")" || true)
	[ -z "$hits" ] || { echo "measured figures outside a generated section:"; echo "$hits"; return 1; }
}
