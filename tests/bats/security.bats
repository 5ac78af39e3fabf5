#!/usr/bin/env bats
# Who may join a switch (vps-exec(1) SECURITY): only processes that prove
# the job token, never shown on a command line; connections that do not
# prove it within a short fixed deadline are dropped without effect on the
# job; executors listen only where their peers reach them.

load helpers

setup_file() {
	mkdir "$BATS_FILE_TMPDIR/plans" && cd "$BATS_FILE_TMPDIR/plans" || return 1
	vps-layout --model tiny-llama --parallel tp=2,zero=1 --gpus-per-node 2 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=2,zero=1 --gpus-per-node 2 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 64KiB - -o s.staged
}

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
	cp "$BATS_FILE_TMPDIR"/plans/* .
	port=$("$TOP/scripts/free-port.sh")
	tag=sec$$
}

teardown() {
	jobs -p | xargs -r kill 2>/dev/null || true
	wait 2>/dev/null || true
	tail -n 5 e.* t.* 2>/dev/null || true
}

trainers() { # the two ranks' trainers (registry $tag-R)
	for r in 0 1; do
		vps-trainer --registry "$tag-$r" --rank $r --timeout 30 s.staged > t.$r 2>&1 &
	done
}

executor() { # RANK [options]: rank R's executor, in the background, to e.R
	local r=$1
	shift
	vps-exec --registry "$tag-$r" --rank $r --master 127.0.0.1:$port --wait --check "$@" s.staged > e.$r 2>&1 &
}

# wait until rank 0 listens on $port
rank0_listens() {
	for _ in $(seq 100); do
		(exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && return 0
		sleep 0.1
	done
	return 1
}

# the bootstrap's magic, as the executors of this tree speak it (the tests
# that forge a hello must speak it too, or they test an old version's refusal)
hello_magic() { # the 64-bit number
	sed -n 's/^#define HELLO_MAGIC \(0x[0-9a-fA-F]*\)ULL.*/\1/p' "$TOP/lib/exec/net/net_int.h"
}
hello_magic_text() { # its eight bytes as the wire has them, NULs as \0 (a printf format)
	python3 -c 'import struct, sys; print("".join(chr(b) if b else "\\0" for b in struct.pack("<Q", int(sys.argv[1], 16))))' "$(hello_magic)"
}

switched() { # both ranks' digests match and both trainers checked their state
	wait
	for r in 0 1; do grep -q "digest: match" e.$r; done
	for r in 0 1; do grep -q "vps-trainer: rank $r: 1 switch, .* 0 wrong elements, 0 dirty padding, training state carried: ok" t.$r; done
}

@test "a token on the command line is refused: it would show in ps" {
	expect_status 2 vps-exec --token 0123456789abcdef0123456789abcdef --rank 0 --master 127.0.0.1:$port s.staged
	[[ "$output" == *"--token: a secret on the command line shows in ps; export VPS_TOKEN or pass --token-file"* ]]
}

@test "without a job token a multi-rank executor refuses to start, saying how to make one" {
	VPS_TOKEN= expect_status 2 vps-exec --rank 0 --master 127.0.0.1:$port s.staged
	[[ "$output" == *"no job token: export VPS_TOKEN (vps-exec --new-token makes one) or pass --token-file"* ]]
	VPS_TOKEN=short expect_status 2 vps-exec --rank 0 --master 127.0.0.1:$port s.staged
	[[ "$output" == *"VPS_TOKEN: a job token is 16 to 256 characters"* ]]
}

@test "vps-exec --new-token prints a fresh 128-bit token each time" {
	run vps-exec --new-token
	[ "$status" -eq 0 ] && [[ "$output" =~ ^[0-9a-f]{32}$ ]]
	first=$output
	run vps-exec --new-token
	[ "$output" != "$first" ]
}

@test "a token file must be a regular file only its owner can read" {
	vps-exec --new-token > tok
	chmod 644 tok
	expect_status 2 vps-exec --token-file tok --rank 0 --master 127.0.0.1:$port s.staged
	[[ "$output" == *"tok: mode 644 lets other users read the job token (chmod 600 it)"* ]]
	chmod 600 tok
	ln -s tok link
	expect_status 2 vps-exec --token-file link --rank 0 --master 127.0.0.1:$port s.staged
	[[ "$output" == *"link: a symbolic link (refused)"* ]]
	expect_status 2 vps-exec --token-file missing --rank 0 --master 127.0.0.1:$port s.staged
	[[ "$output" == *"missing: No such file or directory"* ]]
}

@test "a switch with the token in a 0600 file, not in the environment" {
	vps-exec --new-token > tok
	chmod 600 tok
	trainers
	for r in 0 1; do VPS_TOKEN= executor $r --token-file tok --timeout 10; done
	switched
}

@test "a stranger with another token cannot join: it is turned away and the job switches" {
	# the stranger runs its own trainer with the same plan and comes first,
	# as rank 1, while rank 0 waits for its ranks
	vps-trainer --registry "$tag-x" --rank 1 --timeout 30 s.staged > t.x 2>&1 &
	trainers
	executor 0 --timeout 10
	rank0_listens
	VPS_TOKEN=ffffffffffffffffffffffffffffffff vps-exec --registry "$tag-x" --rank 1 --master 127.0.0.1:$port \
		--wait --timeout 3 s.staged > e.x 2>&1 &
	stranger=$!
	sleep 1
	executor 1 --timeout 10
	! wait $stranger
	grep -q "vps-exec: rank 1: bootstrap: rank 0 turned this rank away (another job token?)" e.x
	! grep -q "sent" e.x
	switched
	grep -q "switch 1: sent" e.1
}

@test "an impostor rank 0 learns nothing and is named: it cannot prove the token" {
	# something else listens where rank 0 should; it sends a challenge of
	# the right form but cannot answer the hello
	[ -n "$(hello_magic)" ]
	python3 - "$port" "$(hello_magic)" > impostor.log 2>&1 <<'PY' &
import socket, struct, sys, os
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4)
c, _ = s.accept()
c.sendall(struct.pack("<Q", int(sys.argv[2], 16)) + os.urandom(16))
hello = c.recv(80)
print("hello of", len(hello), "bytes")
c.sendall(os.urandom(8))
c.recv(1)
PY
	sleep 0.5
	vps-trainer --registry "$tag-1" --rank 1 --timeout 30 s.staged > t.1 2>&1 &
	expect_status 1 vps-exec --registry "$tag-1" --rank 1 --master 127.0.0.1:$port --wait --timeout 5 s.staged
	[[ "$output" == *"the process at 127.0.0.1:$port did not prove the job token: it is not rank 0 of this job"* ]]
	# the hello carries a MAC, never the token
	! grep -q "0123456789abcdef" impostor.log
}

@test "idle, trickling and forged connections to rank 0 do not disturb the job" {
	trainers
	executor 0 --timeout 10
	rank0_listens
	exec 4<>/dev/tcp/127.0.0.1/$port                         # idle: says nothing
	(for i in $(seq 20); do printf x; sleep 0.5; done) > /dev/tcp/127.0.0.1/$port 2>/dev/null &
	head -c 200 /dev/urandom > /dev/tcp/127.0.0.1/$port      # forged: random bytes
	printf "$(hello_magic_text)%.0s" 1 2 3 4 5 6 7 8 9 10 > /dev/tcp/127.0.0.1/$port  # a hello without the token
	sleep 1
	executor 1 --timeout 10
	exec 4>&-
	switched
}

@test "a trickling connection does not keep rank 0 in bootstrap past --timeout" {
	vps-trainer --registry "$tag-0" --rank 0 --timeout 30 s.staged > t.0 2>&1 &
	start=$SECONDS
	vps-exec --registry "$tag-0" --rank 0 --master 127.0.0.1:$port --wait --timeout 3 s.staged > e.0 2>&1 &
	e0=$!
	rank0_listens
	# a byte a second from a fresh connection each time: each is dropped 5 s
	# after it came at the latest, and none moves rank 0's deadline
	(for i in $(seq 15); do (printf x; sleep 6) > /dev/tcp/127.0.0.1/$port 2>/dev/null & sleep 1; done) &
	! wait $e0
	[ $((SECONDS - start)) -lt 8 ]
	grep -q "bootstrap: rank 1 did not come within 3 s" e.0
}

listen_addresses() { # PID: the addresses its listening TCP sockets are bound to (hex, /proc/net/tcp)
	local inodes
	inodes=$(ls -l /proc/$1/fd 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\]/\1/p')
	for i in $inodes; do awk -v i="$i" '$4 == "0A" && $10 == i { split($2, a, ":"); print a[1] }' /proc/net/tcp; done
}

@test "ranks listen only on the address that reaches the master, or on --bind" {
	vps-trainer --registry "$tag-1" --rank 1 --timeout 30 s.staged > t.1 2>&1 &
	vps-exec --registry "$tag-1" --rank 1 --master 127.0.0.1:$port --wait --timeout 5 s.staged > e.1 2>&1 &
	e1=$!
	sleep 1
	run listen_addresses $e1
	[ -n "$output" ]
	[ "$output" = 0100007F ]    # 127.0.0.1, not 0.0.0.0 (00000000)
	kill $e1
	vps-exec --registry "$tag-1" --rank 1 --master 127.0.0.1:$port --bind 127.0.0.2 --wait --timeout 5 s.staged > e.1 2>&1 &
	e1=$!
	sleep 1
	run listen_addresses $e1
	[ "$output" = 0200007F ]    # 127.0.0.2
	kill $e1
}
