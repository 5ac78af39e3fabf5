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
	[ -n "${reg:-}" ] && rm -f "/dev/shm/$reg" "/dev/shm/$reg".*
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
