#!/usr/bin/env bats
# scripts/demo.sh as a user runs it when something goes wrong: a rank that
# stops, a fault that could never fire, a machine without the room the job
# needs; and its numbers in the tools' units (vps(7) UNITS).

load helpers

DEMO=$TOP/scripts/demo.sh

# run a command in a mount namespace of its own whose /dev/shm is a tmpfs of
# $1 (root only): the room a small machine has, or a /dev/shm no other job
# on this machine writes to
with_shm_of() {
	local size=$1
	shift
	unshare -m true 2>/dev/null || skip "needs a mount namespace of its own (unshare -m, as root)"
	run unshare -m bash -c 'mount -t tmpfs -o size="$1" tmpfs /dev/shm && shift && exec "$@"' - "$size" "$@"
}

@test "an executor that stops (SIGSTOP) is named and killed, the demo fails, and nothing of it is left" {
	local t0=$SECONDS
	# VPS_FAULT=stall:2 stops rank 1's executor at stage 2 (a 64 KiB budget
	# makes hundreds); bash's wait would wait for it forever. In a /dev/shm
	# of its own, so that what is left there after it is the demo's (the
	# machine may run other jobs), listed after the last line.
	with_shm_of 1g bash -c '"$@"; rc=$?; echo "left in /dev/shm:" $(ls /dev/shm); exit $rc' - \
		timeout 120 "$DEMO" --fault-rank 1 stall:2 --budget 64KiB --timeout 5
	echo "$output"
	[ "$status" -eq 1 ]
	[ $((SECONDS - t0)) -lt 60 ]
	[[ "$output" == *"executor 1 (pid "*") is stopped (SIGSTOP)"* ]]
	[[ "$output" == *"executor 1 was stopped (SIGSTOP) and never went on: killed"* ]]
	[[ "$output" == *"vps-trainer: rank 1: switch 1 failed: its executor (pid "*") is gone; sources intact"* ]]
	[[ "$output" != *"Killed"* ]]
	[ "${lines[-1]}" = "left in /dev/shm:" ]
	# a failed demo keeps its files, says where, and no process of it
	# (each runs there) is left
	[[ "${lines[-2]}" == "digest: FAILED (logs in "*")" ]]
	local kept=${lines[-2]#*logs in } p left=
	kept=${kept%)}
	[ -s "$kept/trainer.1.log" ]
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/cwd" 2>/dev/null)" != "$kept" ] || left+=" ${p#/proc/}"
	done
	rm -rf "$kept"
	[ -z "$left" ] || { echo "processes of the demo left:$left" >&2; return 1; }
}

@test "a fault at a stage no staged plan has is refused, not reported as survived" {
	# the default 64 MiB budget makes 2 stages: stage 2 never comes
	expect_status 2 "$DEMO" --fault-rank 1 stall:2
	[[ "$output" == *"demo.sh: --fault-rank 1 stall:2: the staged plans have 2 stages (0 to 1) within --budget 64MiB: stage 2 never comes; a smaller --budget makes more stages"* ]]
	[[ "$output" != *"digest: match"* ]]
	expect_status 2 "$DEMO" --fault-rank 8 exit:0
	[[ "$output" == *"--fault-rank 8: the transition world has ranks 0 to 7"* ]]
	expect_status 2 "$DEMO" --fault-rank 1 pause:1
	[[ "$output" == *"expected stall, exit, kill-trainer or cut"* ]]
}

@test "a /dev/shm too small for the job is refused before anything starts, with what is needed and what is free" {
	with_shm_of 64m "$DEMO" --model gpt3-1.3b
	echo "$output"
	[ "$status" -eq 2 ]
	# both layouts' state, held together during the switch, as vps-layout counts it
	vps-layout -q --model gpt3-1.3b --parallel tp=2,pp=2,dp=2,zero=1 -o a.layout
	vps-layout -q --model gpt3-1.3b --parallel tp=4,pp=1,dp=2,zero=1 -o b.layout
	local a b
	a=$(vps-layout -i a.layout --stats | awk '$1 == "total_bytes:" { print $2 }')
	b=$(vps-layout -i b.layout --stats | awk '$1 == "total_bytes:" { print $2 }')
	[ $((a + b)) -gt $((40 << 30)) ]
	[[ "$output" == *"demo.sh: gpt3-1.3b needs 41.0 GiB in /dev/shm (every rank's state under both layouts, held during the switch); 64.0 MiB is free there"* ]]
	[[ "$output" != *"vps-exec"* ]]
}

@test "an open-file limit below what the executors need is refused" {
	run bash -c 'ulimit -n 40 && exec "$1"' - "$DEMO"
	[ "$status" -eq 2 ]
	[[ "$output" == *"demo.sh: each executor needs 72 open files for a world of 8 (a connection to every peer); the limit is 40 and its hard limit 40"* ]]
}

@test "the demo's sizes are the tools' own, and one rank is one rank" {
	# a plan of 17.7 GiB: not 18141.8 MiB (checked against vps-plan -H,
	# before the room check refuses it)
	with_shm_of 1m "$DEMO" --model gpt3-1.3b
	[ "$status" -eq 2 ]
	vps-layout -q --model gpt3-1.3b --parallel tp=2,pp=2,dp=2,zero=1 -o a.layout
	vps-layout -q --model gpt3-1.3b --parallel tp=4,pp=1,dp=2,zero=1 -o b.layout
	local moved
	moved=$(vps-plan -q a.layout b.layout --stats -H | awk '$1 == "bytes_moved:" { print $2, $3 }')
	[ "$moved" = "17.7 GiB" ]
	[ "${lines[1]}" = "plan: $moved to move, the least any plan moves" ]
	# a world of one device
	run "$DEMO" --model micro-llama --from tp=1 --to tp=1,zero=1 --np 1
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[0]}" = "== micro-llama: (tp=1) -> (tp=1,zero=1), 1 device (0 joining, 0 leaving), 1 per node, over tcp" ]
	printf '%s\n' "${lines[@]}" |
		grep -qxE 'switch 1, its 1 rank: sent 0 B, received 0 B in [0-9.]+ (us|ms|s) \(0 B/s\); paused at most [0-9.]+ (us|ms|s); digest: match' 
	[[ "$output" != *"1 ranks"* ]]
}
