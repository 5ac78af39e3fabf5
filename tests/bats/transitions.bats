#!/usr/bin/env bats
# The paper transitions (configs/transitions): every plan moves exactly the
# lower bound and meets the balance target, and docs/BENCHMARKS.md's table
# of them is what scripts/bench/paper_transitions.sh writes. One run of the
# script (global plans and statistics, no timings) serves both tests.

load helpers

setup_file() {
	export ROWS=$BATS_FILE_TMPDIR/rows
	VPS_BIN=$VPS_BIN "$TOP/scripts/bench/paper_transitions.sh" --check > "$BATS_FILE_TMPDIR/out" 2>&1 &&
		echo 0 > "$BATS_FILE_TMPDIR/status" || echo $? > "$BATS_FILE_TMPDIR/status"
}

@test "every paper transition moves exactly the lower bound, balanced within 1.10 or within 1.02 of the best time" {
	[ -s "$ROWS" ] || { cat "$BATS_FILE_TMPDIR/out"; return 1; }
	[ "$(wc -l < "$ROWS")" = "$(ls "$TOP"/configs/transitions/*.yaml | wc -l)" ]
	# columns: name, world, moved/lower, busiest/bound, sender/bound, GB,
	# estimate, time bound, estimate/time bound, paper, moved, lower bound.
	# The busiest device within 1.10 of the balanced bound; or, where the
	# proximity rule gives bytes up for NVLink (qwen3-*-ep8-ep16), the
	# estimate within 1.02 of the least time the topology allows.
	run awk -F'\t' '
		$11 != $12 || $3 != "1.000" { print $1 ": moved " $11 ", lower bound " $12; bad = 1 }
		$4 == "" || $9 == "" { print $1 ": no figures"; bad = 1 }
		$4 + 0 > 1.10 && $9 + 0 > 1.02 { print $1 ": busiest/bound " $4 ", estimate/time bound " $9; bad = 1 }
		END { exit bad }' "$ROWS"
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
}

@test "docs/BENCHMARKS.md's transitions table is what scripts/bench/paper_transitions.sh writes" {
	[ "$(cat "$BATS_FILE_TMPDIR/status")" = 0 ] || { cat "$BATS_FILE_TMPDIR/out"; return 1; }
}
