#!/usr/bin/env bats
# Waits that speak (vps-exec(1) DIAGNOSTICS): an executor that waits for a
# peer says whom it waits for after a few seconds, again every 10 s on a
# terminal and once in a log, well before its --timeout ends; a peer that
# cannot prove the job token is named after a few refusals and refused
# still. Judged by the messages and their counts, never by the clock.

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
	tag=waits$$
}

teardown() {
	jobs -p | xargs -r kill 2>/dev/null || true
	wait 2>/dev/null || true
	tail -n 5 e.* t.* tty.* 2>/dev/null || true
}

trainer() { # REGISTRY RANK: a trainer that waits for its executor
	vps-trainer --registry "$1" --rank "$2" --timeout 40 s.staged > "t.$1" 2>&1 &
}

# the lines of FILE (carriage returns of a terminal dropped) that match RE
count() { # RE FILE
	tr -d '\r' < "$2" | grep -cE "$1" || true
}

@test "a rank that never comes is named before the timeout ends: every 10 s on a terminal, once in a log" {
	command -v script > /dev/null || skip "script(1) (util-linux) makes the terminal"
	local tty_port log_port alone_port
	tty_port=$("$TOP/scripts/free-port.sh")
	log_port=$("$TOP/scripts/free-port.sh")
	alone_port=$("$TOP/scripts/free-port.sh")
	trainer "$tag-tty" 0
	trainer "$tag-log" 0
	trainer "$tag-alone" 1
	# rank 0 of a world of two whose rank 1 never starts, on a terminal and
	# in a log; and a rank 1 whose rank 0 never starts
	script -qec "vps-exec --registry $tag-tty --rank 0 --master 127.0.0.1:$tty_port --timeout 15 s.staged" \
		tty.0 > tty.out 2>&1 &
	vps-exec --registry "$tag-log" --rank 0 --master 127.0.0.1:$log_port --timeout 15 s.staged > e.0 2>&1 &
	vps-exec --registry "$tag-alone" --rank 1 --master 127.0.0.1:$alone_port --timeout 15 s.staged > e.1 2>&1 &
	wait
	local awaited="^vps-exec: rank 0: bootstrap: waiting for rank 1 to join at 127.0.0.1:"
	# the notice first, the timeout's message last: said while it waited
	[ "$(count "$awaited$log_port \([0-9]+ s so far; timeout 15 s\)\$" e.0)" -eq 1 ]
	[ "$(count "^vps-exec: " e.0)" -eq 2 ]
	[[ "$(head -n 1 e.0)" =~ $awaited ]]
	[ "$(tail -n 1 e.0)" = "vps-exec: rank 0: bootstrap: rank 1 did not come within 15 s" ]
	# on a terminal: after 3 s and 13 s, before the timeout at 15 s
	[ "$(count "$awaited$tty_port \([0-9]+ s so far; timeout 15 s\)\$" tty.0)" -eq 2 ]
	[ "$(count "did not come within 15 s" tty.0)" -eq 1 ]
	# a rank other than 0 names rank 0 and where it looks for it
	[ "$(count "^vps-exec: rank 1: bootstrap: waiting for rank 0 at 127.0.0.1:$alone_port: nobody accepts there yet \([0-9]+ s so far; timeout 15 s\)\$" e.1)" -eq 1 ]
	[ "$(tail -n 1 e.1)" = "vps-exec: rank 1: bootstrap: nobody proved to be rank 0 at 127.0.0.1:$alone_port within 15 s" ]
}

@test "a peer with another job's token is named after a few refusals, and refused until the timeout" {
	local port refused
	port=$("$TOP/scripts/free-port.sh")
	trainer "$tag-0" 0
	trainer "$tag-1" 1
	vps-exec --registry "$tag-0" --rank 0 --master 127.0.0.1:$port --timeout 5 s.staged > e.0 2>&1 &
	VPS_TOKEN=ffffffffffffffffffffffffffffffff \
		vps-exec --registry "$tag-1" --rank 1 --master 127.0.0.1:$port --timeout 5 s.staged > e.1 2>&1 &
	wait
	# named once in a log, at its third refusal, long before the timeout
	[ "$(count "^vps-exec: rank 0: rank 1 at 127.0.0.1 \(as its hello says\) was refused 3 times: it does not prove the job token \(another job's VPS_TOKEN\?\)\$" e.0)" -eq 1 ]
	[ "$(count "was refused" e.0)" -eq 1 ]
	[[ "$(head -n 1 e.0)" == *"was refused 3 times"* ]]
	# and refused still: the timeout's message counts them all
	[[ "$(tail -n 1 e.0)" =~ "bootstrap: rank 1 did not come within 5 s ("[0-9]+" connections that did not prove the job token were dropped, "([0-9]+)" of them from 127.0.0.1 as rank 1: does every rank hold the same VPS_TOKEN?)"$ ]]
	refused=${BASH_REMATCH[1]}
	[ "$refused" -gt 3 ]
	# the refused side hears it from its own refusals
	[ "$(count "^vps-exec: rank 1: rank 0 at 127.0.0.1:$port turned this rank away 3 times: another job's VPS_TOKEN\?\$" e.1)" -eq 1 ]
	[[ "$(tail -n 1 e.1)" == *"bootstrap: rank 0 turned this rank away (another job token?) at 127.0.0.1:$port within 5 s" ]]
	! grep -q "switch 1: sent" e.0 e.1
}
