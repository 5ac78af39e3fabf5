#!/usr/bin/env bats
# -o FILE: a regular file (or none) is replaced whole through a temporary and
# a rename; a character device or a FIFO is written to where it is, never
# replaced; a symbolic link is followed and its target replaced, the link
# kept. vps-layout, vps-plan, vps-stage and vps-exec --report share the writer.

load helpers

layout() { # OUTPUT: the same layout every time
	vps-layout --model tiny-llama --parallel tp=2 --yaml -o "$1"
}

@test "-o a FIFO: its reader gets the bytes and the FIFO stays a FIFO" {
	layout ref
	mkfifo pipe
	timeout 10 cat pipe > got 2>/dev/null 3>&- &
	local reader=$!
	run timeout 10 vps-layout --model tiny-llama --parallel tp=2 --yaml -o pipe
	wait "$reader" || true
	echo "$output"
	[ "$status" -eq 0 ]
	[ -p pipe ]
	cmp ref got
}

@test "-o a character device writes to it and leaves it a device" {
	layout ref
	local dev=$PWD/null
	if ! mknod "$dev" c 1 3 2>/dev/null; then
		# not root here: the system's /dev/null, which this user could not
		# replace anyway (no write permission on /dev)
		dev=/dev/null
	fi
	[ -c "$dev" ]
	expect_status 0 vps-layout --model tiny-llama --parallel tp=2 --yaml -o "$dev"
	[ -c "$dev" ]
	[ ! -s "$dev" ]
	# nothing was left beside it
	[ -z "$(ls "$(dirname "$dev")" | grep -F "$(basename "$dev").tmp")" ]
}

@test "-o a link to standard output (a pipe) writes into the pipe" {
	layout ref
	run bash -c 'vps-layout --model tiny-llama --parallel tp=2 --yaml -o /proc/self/fd/1 | cat > got'
	echo "$output"
	[ "$status" -eq 0 ]
	cmp ref got
}

@test "-o a symbolic link replaces its target and keeps the link" {
	layout ref
	mkdir -p dir sub
	echo previous > dir/file
	ln -s ../dir/file sub/rel
	ln -s "$PWD/sub/rel" abs
	expect_status 0 vps-layout --model tiny-llama --parallel tp=2 --yaml -o abs
	[ -L abs ] && [ -L sub/rel ]
	[ "$(readlink sub/rel)" = ../dir/file ]
	[ -f dir/file ] && [ ! -L dir/file ]
	cmp ref dir/file
	# a link to nothing yet: its target is made
	ln -s made dangling
	expect_status 0 vps-layout --model tiny-llama --parallel tp=2 --yaml -o dangling
	[ -L dangling ]
	cmp ref made
	# no temporaries beside the link or the target
	[ -z "$(ls -a . dir sub | grep '\.tmp')" ]
}

@test "-o a regular file replaces it whole and keeps its permissions" {
	layout ref
	echo previous > out
	chmod 0600 out
	expect_status 0 vps-layout --model tiny-llama --parallel tp=2 --yaml -o out
	cmp ref out
	[ "$(stat -c %a out)" = 600 ]
	layout new
	[ "$(stat -c %a new)" = 644 ]
}

@test "a failed write leaves the previous file as it was, and no temporary" {
	echo previous > out
	# no byte may be written to any file: the temporary's write fails
	run bash -c 'trap "" XFSZ; ulimit -f 0; exec vps-layout --model tiny-llama --parallel tp=2 --yaml -o out'
	echo "$output"
	[ "$status" -ne 0 ]
	[[ "$output" == *"out: write failed"* ]]
	[ "$(cat out)" = previous ]
	[ -z "$(ls -a | grep '\.tmp')" ]
}

@test "-o a directory is refused by name" {
	mkdir d
	expect_status 2 vps-layout --model tiny-llama --parallel tp=2 --yaml -o d
	[[ "$output" == *"d: is a directory; vps writes a regular file, a character device or a FIFO"* ]]
	[ -d d ]
}

@test "the project's scripts never write to /dev/null with -o" {
	run grep -rnE -- '(-o|--output|--report)[ =]+/dev/' "$TOP/scripts" "$TOP/Makefile"
	echo "$output"
	[ "$status" -eq 1 ]
}
