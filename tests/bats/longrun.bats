#!/usr/bin/env bats
# Long runs: one `vps-exec --serve` per rank switches back and forth many
# times, and nothing may grow after a warm-up: not the trainers' or the
# executors' mappings, fds or RSS, not the job's objects in /dev/shm.
# Sampled every switch, whatever the machine's speed or load.
# scripts/bench/longrun.sh measures it (docs/BENCHMARKS.md, "Long runs",
# has the 1000-switch run); this is its short version.

load helpers
export VPS_BIN

longrun() { # TRANSPORT
	# under AddressSanitizer (make asan) freed memory waits in its
	# quarantine, up to 256 MiB a process: RSS rises by design, so only
	# mappings, fds and /dev/shm are judged there. Nor is a leak at exit
	# (the other suites judge those): once, a trainer that had switched
	# 200 times hung at its exit for 12 minutes, LeakSanitizer's tracer
	# waiting for the main thread to stop while it spun
	local slack=16 asan=${ASAN_OPTIONS:-}
	if grep -qa __asan_init "$VPS_BIN/vps-exec"; then
		slack=512
		asan=${asan:+$asan:}detect_leaks=0
	fi
	ASAN_OPTIONS=$asan run "$TOP/scripts/bench/longrun.sh" --switches 200 --warmup 20 --rows 6 \
		--model "$TOP/scripts/bench/models/micro-llama.yaml" --transport "$1" --rss-slack "$slack"
	echo "$output" >&2
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = "verdict: flat" ]
	# sampled by switches, not by time: each window of 60 switches has
	# about a sample a switch, on a fast idle machine as on a loaded one
	local n1 n2
	read -r n1 n2 < <(sed -n 's/^after 20 switches of warm-up: .* (\([0-9]*\) and \([0-9]*\) samples)$/\1 \2/p' <<<"$output")
	[ "$n1" -ge 40 ] && [ "$n2" -ge 40 ]
	# a leak could hide behind an executor or a trainer that was never sampled
	[ "$(grep -c '^executor [01]: ' <<<"$output")" -eq 2 ]
	[ "$(grep -c '^trainer [01]: ' <<<"$output")" -eq 2 ]
}

@test "tcp: 200 switches back and forth in one --serve: nothing grows" { longrun tcp; }
@test "ipc: 200 switches back and forth in one --serve: nothing grows" { longrun ipc; }

@test "longrun.sh: bad arguments exit 2" {
	expect_status 2 "$TOP/scripts/bench/longrun.sh" --transport nccl
	expect_status 2 "$TOP/scripts/bench/longrun.sh" --switches 3
	expect_status 2 "$TOP/scripts/bench/longrun.sh" --switches x
	expect_status 2 "$TOP/scripts/bench/longrun.sh" --every 0
	expect_status 2 "$TOP/scripts/bench/longrun.sh" --every x
}
