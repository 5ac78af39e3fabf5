#!/usr/bin/env bats
# The elastic job (examples/torch/launch.py, vps(7) DEVICES JOIN AND LEAVE)
# under faults and bad requests, as an operator or a scheduler meets them:
# a frozen process, a second launch, a torn or impossible request, a
# launcher killed, an executor whose trainer never came. Each case ends
# with the process named, the job trained on or stopped whole, nothing
# left running (docs/RELIABILITY.md, the elastic table). Short timeouts
# keep them quick; the bounds on time are generous.

load helpers

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
}

# what a test started in the background is killed however the test ends;
# the launcher's processes die with it (PR_SET_PDEATHSIG)
teardown() {
	local pid
	for pid in $(cat "$BATS_TEST_TMPDIR"/bg.pids 2>/dev/null); do
		kill -KILL "$pid" 2>/dev/null || true
	done
}

torch_or_skip() {
	framework_job
	"$PY" -c 'import torch' 2>/dev/null || skip "$PY has no torch (make venv makes the test environment)"
}

launch() {
	"$PY" "$TOP/examples/torch/launch.py" --model micro-llama --gpus-per-node 8 "$@"
}

# in the background, its pid noted for teardown: PID is set
launch_bg() { # OUT ARGS...
	local out=$1
	shift
	"$PY" "$TOP/examples/torch/launch.py" --model micro-llama --gpus-per-node 8 "$@" > "$out" 2>&1 &
	PID=$!
	echo "$PID" >> "$BATS_TEST_TMPDIR"/bg.pids
}

wait_for() { # FILE: until it exists and is not empty (the job got that far), at most 600 s
	local i
	for i in $(seq 6000); do [ -s "$1" ] && return 0; sleep 0.1; done
	echo "$1 never came" >&2
	return 1
}

# every pid given has ended, or after 10 s says which has not
all_gone() {
	local i pid left
	for i in $(seq 100); do
		left=''
		for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left="$left $pid"; done
		[ -z "$left" ] && return 0
		sleep 0.1
	done
	echo "still running:$left" >&2
	ps -o pid,stat,args -p "${left# }" >&2 || true
	return 1
}

@test "vps-exec --wait=S gives up on a registry that never comes, naming it; --wait alone waits" {
	vps-layout -q --model micro-llama --parallel tp=2 --gpus-per-node 2 -o a.layout
	vps-layout -q --model micro-llama --parallel dp=2 --gpus-per-node 2 -o b.layout
	vps-plan -q a.layout b.layout -o ab.plan
	vps-stage -q --budget 64MiB ab.plan -o ab.staged
	local port
	port=$("$TOP/scripts/free-port.sh")
	expect_status 1 timeout 60 vps-exec --registry "never-$$-%r" --rank 0 --world 2 --master 127.0.0.1:$port \
		--wait=1.5 ab.staged
	[ "$output" = "vps-exec: rank 0: no trainer has created registry never-$$-0 (/dev/shm/never-$$-0) within 1.5 s (--wait=1.5): its trainer never started, or died first" ]
	# without a bound it is still waiting when timeout(1) ends it
	expect_status 124 timeout 5 vps-exec --registry "never-$$-%r" --rank 0 --world 2 --master 127.0.0.1:$port \
		--wait ab.staged
	[[ "$output" == *"waiting for a trainer to create registry never-$$-0"* ]]
	expect_status 2 vps-exec --wait=0 ab.staged
	[ "${lines[0]}" = "vps-exec: --wait: '0' is not a positive number of seconds" ]
}

# issue 37 (1): a process that leaves, frozen (SIGSTOP) as the 8 -> 4 switch
# starts. The launcher names it (its pid, stopped, what it was doing) when
# its heartbeat has been silent half the timeout (--timeout 30: the 4
# processes that join start Python and PyTorch within it, on a loaded
# machine too), kills it, and its state
# having replicas (dp=8) the switch goes on without it; the job trains to
# the end, every sample once.
@test "a process that leaves, frozen during the shrink, is named and killed, and the switch goes on without it" {
	torch_or_skip
	ls /dev/shm | grep '^vps-torch-' > before || true
	VPS_TRAIN_FAULT=5:freeze:2 run timeout 300 "$PY" "$TOP/examples/torch/launch.py" --model micro-llama \
		--gpus-per-node 8 --nproc 4 --dir r --steps 12 --switch-every 4 --check-switch --timeout 30 \
		--exec-timeout 10 --configs tp=2:dp=2,dp=8,tp=2:pp=2
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" =~ launch.py:\ process\ 5\ \(pid\ ([0-9]+),\ stopped\)\ gave\ no\ sign\ of\ life\ for\ [0-9]+\ s\ while\ in\ switch\ 2\ to\ tp=2,pp=2\ \(attempt\ 1,\ as\ a\ process\ that\ leaves\):\ killed ]]
	local frozen=${BASH_REMATCH[1]}
	[[ "$output" == *"launch.py: process 5 (frozen, killed), which leaves, died during switch 2; its state has replicas: the switch goes on without it (vps-plan --lost 5)"* ]]
	[[ "$output" == *"on 4 -> 8 -> 4 processes: tp=2,dp=2, then dp=8 on 8 from step 4, then tp=2,pp=2 on 4 from step 8 (2 switches)"* ]]
	[[ "$output" == *"(vps-exec --check): 15 of 15"* ]]
	[[ "$output" == *"every sample read exactly once, 8 a step (the global batch) at every step: 96 samples in 12 steps"* ]]
	! kill -0 "$frozen" 2>/dev/null
	run shm_left vps-torch before
	[ -z "$output" ]
}

# issue 37 (2): the same --dir twice, as an operator running the command
# again: the second is refused at once naming the first, which finishes as
# if alone (its data order intact).
@test "a second launch with the same --dir is refused at once, naming the job that holds it; the first finishes alone" {
	torch_or_skip
	: > ctl
	launch_bg first.out --nproc 4 --dir r --steps 8 --configs tp=2:dp=2 --control ctl
	wait_for r/loss.txt
	expect_status 2 launch --nproc 4 --dir r --steps 8 --configs tp=2:dp=2 --control ctl
	[[ "$output" =~ ^launch.py:\ --dir\ r:\ in\ use\ by\ the\ job\ of\ launch.py\ pid\ $PID\ \(started\ .*\):\ give\ this\ one\ another\ --dir,\ or\ wait\ for\ that\ one\ to\ end$ ]]
	local rc=0
	wait "$PID" || rc=$?
	cat first.out
	[ "$rc" -eq 0 ]
	grep -q 'every sample read exactly once, 8 a step (the global batch) at every step: 64 samples in 8 steps$' first.out
	# and the directory is free again
	[ "$(wc -l < r/loss.txt)" -eq 8 ]
}

# issue 37 (3): a control file replaced while the job runs by one that does
# not keep the lines read is refused whole (no line of it read from the old
# one's offset: the bytes there spell pp=2:dp=2); one renamed over it that
# keeps them is read, its new line asked for.
@test "a control file replaced by one that does not keep its lines is refused whole; one that keeps them is read" {
	torch_or_skip
	printf '#abcdef\n' > ctl
	launch_bg out --nproc 4 --dir r --steps 60 --configs tp=2:dp=2 --control ctl
	wait_for r/loss.txt
	# the same length as the first, then a request where the old offset falls
	printf '#abcdef pp=2:dp=2\n' > ctl.new && mv ctl.new ctl
	local i
	for i in $(seq 600); do grep -q 'are not as they were' out && break; sleep 0.1; done
	printf '#abcdef\ntp=2:pp=2\n' > ctl.new && mv ctl.new ctl
	kill -USR1 "$PID" || true # read at once; a new file is read anyway
	local rc=0
	wait "$PID" || rc=$?
	cat out
	[ "$rc" -eq 0 ]
	grep -q '^launch.py: ctl: its first 1 line, read already, are not as they were (rewritten in place, truncated, or replaced by a file that does not keep them): not read; a request is a line appended to it, or a new file, keeping those lines, renamed over it; the job trains on$' out
	! grep -q 'pp=2,dp=2 asked for' out
	grep -q '^launch.py: ctl: tp=2,pp=2 asked for (request 1)$' out
	grep -q '^launch.py: micro-llama trained for 60 steps on 4 processes: tp=2,dp=2, then tp=2,pp=2 from step [0-9]* (1 switch)$' out
}

# issue 37 (4): requests the job cannot take (the batch, the model, the
# world, bytes that are not a configuration) are refused with the reason,
# and the job trains on to the end.
@test "requests the batch, the model or the world cannot take, or not text, are refused with the reason; the job trains on" {
	torch_or_skip
	printf 'dp=3\ndp=10000\ntp=3\nhello\ndp=\0\n\377\376\n' > ctl
	run timeout 300 "$PY" "$TOP/examples/torch/launch.py" --model micro-llama --gpus-per-node 8 --nproc 4 --dir r \
		--steps 4 --configs tp=2:dp=2 --control ctl
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"launch.py: ctl: line 1: dp=3: refused: vps-plan: "*"global batch"*"; the job trains on"* ]]
	[[ "$output" == *"launch.py: ctl: line 2: dp=10000: refused: a world of 10000 processes; --max-nproc is 64; the job trains on"* ]]
	[[ "$output" == *"launch.py: ctl: line 3: tp=3: refused: "*"tp=3 does not divide heads=8 of micro-llama"*"; the job trains on"* ]]
	[[ "$output" == *"launch.py: ctl: line 4: hello: refused: "* ]]
	[[ "$output" == *"launch.py: ctl: line 5: 'dp=\\\\x00': a NUL byte: refused; the job trains on"* ]]
	[[ "$output" == *"launch.py: ctl: line 6: '\\\\xff\\\\xfe': bytes that are not UTF-8 text (at 0): refused; the job trains on"* ]]
	[[ "$output" == *"launch.py: micro-llama trained for 4 steps on 4 processes: tp=2,dp=2 (0 switches)"* ]]
	[[ "$output" != *Traceback* ]]
	[ "$(wc -l < r/loss.txt)" -eq 4 ]
}

# issue 37 (4): no process of the job outlives its launcher: stopped by
# SIGTERM it stops them and says so; killed (SIGKILL) they die with it.
@test "no process of the job outlives its launcher, stopped by SIGTERM or killed" {
	torch_or_skip
	local sig kids rc
	for sig in TERM KILL; do
		rm -rf r
		: > ctl
		launch_bg out.$sig --nproc 4 --dir r --steps 10000 --configs tp=2:dp=2 --control ctl
		wait_for r/loss.txt
		kids=$(pgrep -P "$PID" | tr '\n' ' ')
		[ -n "$kids" ]
		kill -$sig "$PID"
		rc=0
		wait "$PID" || rc=$?
		cat out.$sig
		all_gone $kids
		if [ $sig = TERM ]; then
			[ "$rc" -eq 1 ]
			grep -q '^launch.py: stopped by SIGTERM: the job.s processes are stopped$' out.$sig
		else
			[ "$rc" -eq 137 ]
			# a launcher killed cannot clean up: its trainers' registries stay, stale
			PYTHONPATH="$TOP/python" "$PY" -c 'import sys, vps
for r in range(4): vps.Registry.unlink("vps-torch-%s-%d" % (sys.argv[1], r))' "$PID"
		fi
	done
}
