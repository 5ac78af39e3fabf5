#!/usr/bin/env bats
# The trainer's registry in /dev/shm: an executor trusts only its own user's
# private objects, and a trainer removes only what a dead vps trainer of its
# user left, never another program's objects of the same name.

load helpers

one_rank() { # a one-device switch (ZeRO-1 to ZeRO-0) and a registry name of this test's own
	vps-layout --model tiny-llama --parallel tp=1,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,zero=0 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	reg=vps-bats-$$-$BATS_TEST_NUMBER
}

joiner() { # rank 1 joins rank 0 (tp=1 to dp=2): it holds only its targets, NAME.0 to NAME.3
	vps-layout --model tiny-llama --parallel tp=1,zero=1 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2,zero=1 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o s.staged
	reg=vps-bats-$$-$BATS_TEST_NUMBER
	rank=1
}

# Start a trainer and wait until its registry holds object $1 (one rank:
# the sources are NAME.0 to NAME.3, the targets NAME.4 to NAME.7).
start_trainer() {
	vps-trainer --registry "$reg" --rank "${rank:-0}" --timeout "${2:-10}" s.staged > t.0 2>&1 &
	trainer=$!
	local i
	for i in $(seq 600); do
		[ -e "/dev/shm/$reg.$1" ] && return 0
		sleep 0.05
	done
	echo "the trainer made no /dev/shm/$reg.$1" >&2
	cat t.0 >&2
	return 1
}

stop_trainer() {
	kill "$trainer" 2>/dev/null || true
	wait "$trainer" || true
}

teardown() {
	[ -n "${trainer:-}" ] && stop_trainer
	local p
	# what a failed @test left running (each is unset once waited for)
	for p in "${tp[@]}" "${ep[@]}"; do
		kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
	done
	[ -n "${reg:-}" ] && rm -f "/dev/shm/$reg" "/dev/shm/$reg".* "/dev/shm/$reg"-*
	return 0
}

exec_one() {
	run vps-exec --registry "$reg" --rank 0 --master 127.0.0.1:$port --timeout 30 s.staged
}

@test "a registry that others can write is refused by the executor, naming it and its mode" {
	one_rank
	start_trainer 5
	chmod 0666 "/dev/shm/$reg"
	exec_one
	echo "$output"
	[ "$status" -eq 2 ]
	[[ "$output" == *"/dev/shm/$reg: mode 0666 lets other users open it; vps uses only objects of mode 0600"* ]]
}

@test "a buffer object that the group can read is refused: the switch fails on it, the sources intact" {
	one_rank
	start_trainer 5
	chmod 0640 "/dev/shm/$reg.1"
	exec_one
	echo "$output"
	[ "$status" -eq 2 ]
	[[ "$output" == *"source buffer 1: shared memory /dev/shm/$reg.1: mode 0640 lets other users open it"* ]]
	wait "$trainer" || true
	trainer=
	grep -q "switch 1 failed: .*/dev/shm/$reg.1: mode 0640 .*; sources intact" t.0
}

@test "a registry or a buffer of another user is refused (as root: given to nobody)" {
	[ "$(id -u)" -eq 0 ] || skip "not root: cannot give an object to another user"
	one_rank
	start_trainer 5
	chown 65534 "/dev/shm/$reg"
	exec_one
	echo "$output"
	[ "$status" -eq 2 ]
	[[ "$output" == *"/dev/shm/$reg: owned by uid 65534, not by this user (uid 0)"* ]]
	chown 0 "/dev/shm/$reg"
	chown 65534 "/dev/shm/$reg.4"
	exec_one
	echo "$output"
	[ "$status" -eq 2 ]
	[[ "$output" == *"target buffer "[0-9]": shared memory /dev/shm/$reg.4: owned by uid 65534"* ]]
}

@test "the trainer refuses a NAME that is not a vps registry, and leaves it" {
	one_rank
	head -c 4096 /dev/urandom > "/dev/shm/$reg"
	cp "/dev/shm/$reg" before
	expect_status 2 vps-trainer --registry "$reg" --rank 0 --timeout 1 s.staged
	[[ "$output" == *"/dev/shm/$reg exists and is not a vps registry"* ]]
	[[ "$output" == *"left alone"* ]]
	cmp before "/dev/shm/$reg"
}

@test "a stale registry goes with its own objects; a foreign NAME.7 and NAME.x stay" {
	joiner
	start_trainer 3
	kill -9 "$trainer"
	wait "$trainer" || true
	trainer=
	# the killed trainer left its registry and its four objects
	[ -e "/dev/shm/$reg" ] && [ -e "/dev/shm/$reg.3" ]
	echo foreign > "/dev/shm/$reg.7"
	echo foreign > "/dev/shm/$reg.x"
	# the next trainer of that name replaces the stale registry (and, with no
	# executor, gives up on its switch after a second)
	run vps-trainer --registry "$reg" --rank 1 --timeout 1 s.staged
	echo "$output"
	[ "$status" -eq 1 ]
	[[ "$output" == *"switch 1 not done after 1.0 s"* ]]
	[ ! -e "/dev/shm/$reg" ] && [ ! -e "/dev/shm/$reg.0" ] && [ ! -e "/dev/shm/$reg.3" ]
	[ "$(cat "/dev/shm/$reg.7")" = foreign ]
	[ "$(cat "/dev/shm/$reg.x")" = foreign ]
}

@test "a foreign NAME.N in the trainer's way is refused by name, and left" {
	joiner
	echo foreign > "/dev/shm/$reg.2"
	expect_status 2 vps-trainer --registry "$reg" --rank 1 --timeout 1 s.staged
	[[ "$output" == *"registry $reg: /dev/shm/$reg.2 exists and is not this registry's"* ]]
	[ "$(cat "/dev/shm/$reg.2")" = foreign ]
	[ ! -e "/dev/shm/$reg" ] && [ ! -e "/dev/shm/$reg.0" ]
}

@test "a trainer killed before it made its registry leaves another's live registry alone" {
	one_rank
	start_trainer 7 60
	# a second trainer of the same name is refused while the first lives
	expect_status 2 vps-trainer --registry "$reg" --rank 0 --timeout 1 s.staged
	[[ "$output" == *"registry $reg is in use by pid $trainer"* ]]
	# and one stopped by a signal before it took the name (still waiting
	# for its plan) removes nothing
	mkfifo never
	vps-trainer --registry "$reg" --rank 0 --timeout 1 never &
	local other=$!
	sleep 0.5
	kill -TERM "$other"
	wait "$other" || true
	[ -e "/dev/shm/$reg" ] && [ -e "/dev/shm/$reg.0" ]
	exec_one
	echo "$output"
	[ "$status" -eq 0 ]
}

@test "a trainer stopped by SIGTERM removes its own registry and objects, and no other" {
	joiner
	echo foreign > "/dev/shm/$reg.9"
	start_trainer 3 20
	kill -TERM "$trainer"
	wait "$trainer" || true
	trainer=
	[ ! -e "/dev/shm/$reg" ] && [ ! -e "/dev/shm/$reg.0" ] && [ ! -e "/dev/shm/$reg.3" ]
	[ "$(cat "/dev/shm/$reg.9")" = foreign ]
}

# ---- one executor per registry ----

two_ranks() { # a two-device switch (tp=2 to dp=2), registries $reg-0 and $reg-1
	vps-layout --model tiny-llama --parallel tp=2,zero=1 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel dp=2,zero=1 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB - -o s.staged
	port=$("$TOP/scripts/free-port.sh")
	reg=vps-bats-$$-$BATS_TEST_NUMBER
}

# Both trainers of the two-rank job, and rank 0's executor waiting in the
# rendezvous for rank 1's: it holds $reg-0 once it maps it.
job_without_rank1() {
	for r in 0 1; do
		vps-trainer --registry "$reg-$r" --rank $r --timeout 60 s.staged > t.$r 2>&1 &
		tp[$r]=$!
	done
	vps-exec --registry "$reg-%r" --rank 0 --master 127.0.0.1:$port --wait --timeout 60 s.staged > e.0 2>&1 &
	ep[0]=$!
	local i
	for i in $(seq 600); do
		grep -q "/dev/shm/$reg-0\$" /proc/${ep[0]}/maps 2>/dev/null && return 0
		sleep 0.05
	done
	echo "rank 0's executor did not map /dev/shm/$reg-0" >&2
	cat e.0 t.0 >&2
	return 1
}

# Rank 1's executor comes: the job switches, every rank ok.
job_switches() {
	vps-exec --registry "$reg-%r" --rank 1 --master 127.0.0.1:$port --wait --timeout 60 s.staged > e.1 2>&1 &
	ep[1]=$!
	local r st
	for r in 0 1; do
		st=0
		wait ${ep[$r]} || st=$?
		wait ${tp[$r]} || st=$?
		unset "ep[$r]" "tp[$r]"
		cat e.$r t.$r
		[ "$st" -eq 0 ]
		grep -q "training state carried: ok" t.$r
	done
	rm -f "/dev/shm/$reg"-*
}

@test "another job given the same registry names is refused, naming the executor that holds them, and the job switches" {
	two_ranks
	local other=$port
	while [ "$other" = "$port" ]; do other=$("$TOP/scripts/free-port.sh"); done
	job_without_rank1
	# the other job's executor of rank 0, rendezvous elsewhere: it would
	# have waited out its bootstrap there, then aborted this job's trainer
	run vps-exec --registry "$reg-%r" --rank 0 --master 127.0.0.1:$other --timeout 2 s.staged
	echo "$output"
	[ "$status" -eq 2 ]
	[ "$output" = "vps-exec: rank 0: registry $reg-0 is in use by another executor (pid ${ep[0]}); one executor serves a registry" ]
	# and its trainer is refused too
	run vps-trainer --registry "$reg-0" --rank 0 --timeout 2 s.staged
	[ "$status" -eq 2 ]
	[ "$output" = "vps-trainer: rank 0: registry $reg-0 is in use by pid ${tp[0]}, its live trainer" ]
	job_switches
}

@test "a second executor of one rank is refused, naming the other executor, and the job switches" {
	two_ranks
	job_without_rank1
	# the same rank of the same job again: it would have failed to listen
	# on rank 0's port and aborted the trainer it attached to
	run vps-exec --registry "$reg-%r" --rank 0 --master 127.0.0.1:$port --timeout 2 s.staged
	echo "$output"
	[ "$status" -eq 2 ]
	[[ "$output" == *"registry $reg-0 is in use by another executor (pid ${ep[0]})"* ]]
	job_switches
}

@test "two jobs with the default registry names switch side by side on one node" {
	one_rank
	# another staging of the same switch: another job
	vps-plan a.layout b.layout | vps-stage --budget 2MiB - -o other.staged
	local other=$port
	while [ "$other" = "$port" ]; do other=$("$TOP/scripts/free-port.sh"); done
	vps-trainer --rank 0 --timeout 60 s.staged > t.1 2>&1 &
	tp[1]=$!
	vps-trainer --rank 0 --timeout 60 other.staged > t.2 2>&1 &
	tp[2]=$!
	vps-exec --rank 0 --master 127.0.0.1:$port --timeout 30 s.staged > e.1 2>&1 &
	ep[1]=$!
	vps-exec --rank 0 --master 127.0.0.1:$other --timeout 30 other.staged > e.2 2>&1 &
	ep[2]=$!
	local j st=0
	for j in 1 2; do
		wait ${ep[$j]} || st=$?
		wait ${tp[$j]} || st=$?
		unset "ep[$j]" "tp[$j]"
	done
	cat e.1 e.2 t.1 t.2
	[ "$st" -eq 0 ]
	grep -q "training state carried: ok" t.1
	grep -q "training state carried: ok" t.2
}

# ---- waits say what they wait for ----

@test "an executor whose trainer never comes says what it waits for, then names the registry and the likely cause" {
	one_rank
	run vps-exec --registry "$reg" --rank 0 --master 127.0.0.1:$port --timeout 5 s.staged
	echo "$output"
	[ "$status" -eq 2 ]
	[ "${lines[0]}" = "vps-exec: rank 0: waiting for a trainer to create registry $reg (/dev/shm/$reg)" ]
	[ "${lines[1]}" = "vps-exec: rank 0: no trainer has created registry $reg within 5 s: is --registry the same for the trainer and vps-exec?" ]
	[ "${#lines[@]}" -eq 2 ]
	# the default name: the job's tag and the rank
	run vps-exec --rank 0 --master 127.0.0.1:$port --timeout 1 s.staged
	[ "$status" -eq 2 ]
	[[ "$output" =~ ^"vps-exec: rank 0: no trainer has created registry vps-"[0-9a-f]{8}"-0 within 1 s" ]]
}

@test "an executor facing a stale registry says so, waits for a trainer to replace it, and gives up naming it" {
	one_rank
	start_trainer 3
	kill -9 "$trainer"
	wait "$trainer" || true
	local dead=$trainer
	trainer=
	run vps-exec --registry "$reg" --rank 0 --master 127.0.0.1:$port --timeout 4 s.staged
	echo "$output"
	[ "$status" -eq 2 ]
	[ "${lines[0]}" = "vps-exec: rank 0: registry $reg is stale (its trainer, pid $dead, is gone); waiting for a trainer to replace it" ]
	[ "${lines[1]}" = "vps-exec: rank 0: registry $reg is stale (its trainer, pid $dead, is gone), and no trainer replaced it within 4 s" ]
}

@test "an executor under --wait says, once, that it waits for its trainer's request, and under which name" {
	one_rank
	# a trainer that takes its time: it holds its registry, and asks for no
	# switch for a long while (stopped, so that it costs nothing)
	vps-trainer --registry "$reg" --rank 0 --steps 1000000 --timeout 60 s.staged > t.0 2>&1 &
	trainer=$!
	local i
	for i in $(seq 600); do
		[ -e "/dev/shm/$reg.3" ] && break
		sleep 0.05
	done
	kill -STOP "$trainer"
	vps-exec --registry "$reg" --rank 0 --master 127.0.0.1:$port --wait s.staged > e.0 2>&1 &
	local ex=$!
	for i in $(seq 300); do
		grep -q waiting e.0 && break
		sleep 0.05
	done
	sleep 1
	kill "$ex"
	wait "$ex" || true
	kill -CONT "$trainer"
	cat e.0
	[ "$(cat e.0)" = "vps-exec: rank 0: waiting for the trainer (pid $trainer) of registry $reg to request a switch" ]
}

@test "a trainer whose executor never comes says early what it waits for, and why it gave up, in words" {
	one_rank
	run vps-trainer --registry "$reg" --rank 0 --timeout 5 s.staged
	echo "$output"
	[ "$status" -eq 1 ]
	local what="requested; no executor has attached to it (is vps-exec running, with the same --registry?)"
	[ "${lines[0]}" = "vps-trainer: rank 0: waiting for switch 1 in registry $reg: $what" ]
	[ "${lines[1]}" = "vps-trainer: rank 0: registry $reg: switch 1 not done after 5.0 s: $what; sources intact" ]
}
