#!/usr/bin/env bats
# The executors' control plane as scripts/bench/control_plane.sh runs it
# (build/bench/control_plane: every rank a thread running lib/exec/net over
# loopback): whatever the world, each collective costs each rank a few
# messages over its control tree, a rank holds connections only to the
# ranks it exchanges data with and to its tree neighbours, and rank 0's
# bootstrap star is closed before the first switch.
load helpers

cp=$TOP/build/bench/control_plane

@test "control plane at 64 and 100 ranks: at most 2 log2 W messages a collective on every rank, rank 0 no more than any" {
	plain_make -s build/bench/control_plane >/dev/null
	run "$cp" --timeout 60 64 100
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output"
	[ "$(echo "$output" | grep -c '^world ')" -eq 2 ]
	# every field of each world's line, by name
	echo "$output" | awk '
		$1 != "world" { next }
		{
			W = $2
			for (i = 3; i < NF; i += 2) v[$i] = $(i + 1)
			log2 = log(W) / log(2)
			bad = 0
			# a part up and the result down on at most 1 + 4 tree links
			if (v["busiest_messages_per_collective"] > 2 * log2 || v["busiest_messages_per_collective"] > 10) bad = bad " messages"
			if (v["rank0_messages_per_collective"] > 8) bad = bad " rank0"
			# the mesh: its ring neighbours and its partners in the stage boundaries all-reduce
			if (v["data_connections_max"] > 2 + int(log2) + 1) bad = bad " data"
			if (v["control_connections_max"] > 5) bad = bad " control"
			if (v["rank0_bootstrap_connections"] != W - 1) bad = bad " bootstrap"
			# no rank holds O(W) once started; rank 0 held its W-entry table
			if (v["memory_max"] > 16384 || v["rank0_memory_peak"] > 16 * W + 16384) bad = bad " memory"
			if (bad) { print "world " W ":" bad; failed = 1 }
		}
		END { exit failed }'
	# and each of rank 0 collectives, phase by phase
	echo "$output" | awk '$1 == "phase" && $3 != "bootstrap" && $3 != "stage" && $9 > 8 { print; bad = 1 } END { exit bad }'
}

@test "control_plane.sh: its tables, an idle executor's CPU, and its last line" {
	IDLE_SECONDS=2 run "$TOP/scripts/bench/control_plane.sh" 16 32
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	[[ "${lines[-1]}" =~ ^control\ plane:\ 32\ ranks,\ rank\ 0\ [0-9.]+\ s,\ [0-9]+\ messages\ per\ collective$ ]]
	[[ "$output" == *"An idle executor"* ]]
	# from 128 ranks up, the targets' ratios and their verdicts
	RUNS=1 IDLE_SECONDS=1 run "$TOP/scripts/bench/control_plane.sh" 128 160 192
	[ "$status" -eq 0 ] || { echo "$output"; return 1; }
	echo "$output" | grep -E "^At 192 ranks against 128: .* Verdict: CPU time (met|\*\*not met\*\*), messages (met|\*\*not met\*\*)\.$"
	echo "$output" | grep -E "^From 160 to 192 ranks .* woke [0-9]+ to [0-9]+ times per collective\.$"
	echo "$output" | grep -E "^\| 128, paced like 192 \| 4 \|( [0-9.]+ ms, 8 \|){6} [0-9.]+ ms \|$"
	echo "$output" | grep -E "^At 192 ranks against 128 paced like it: rank 0's CPU time per collective [0-9.]+x .* Verdict, the world's own share: (met|\*\*not met\*\*)\.$"
	run "$TOP/build/bench/control_plane" --pace -1 16
	[ "$status" -eq 2 ] && [[ "$output" == *"--pace -1: not milliseconds"* ]]
	run "$TOP/scripts/bench/control_plane.sh" 16 x
	[ "$status" -eq 2 ]
}
