#!/usr/bin/env bats
# vps-stage as a user runs it.

load helpers

setup_file() {
	cd "$BATS_FILE_TMPDIR"
	vps-plan --transition llama2-13b-ablation-s1-s2 -o ablation.plan
}

@test "a staged plan verifies and keeps every stage within the budget" {
	cd "$BATS_FILE_TMPDIR"
	vps-stage --budget 2GiB ablation.plan -o s.staged
	expect_status 0 vps-verify s.staged
	[[ "$output" == "s.staged: ok: llama2-13b: "*" stages within a 2.00 GiB budget, "* ]]
	run vps-stage --budget 2GiB ablation.plan --stats
	peak=$(awk '$1 == "peak_max:" { print $2 }' <<<"$output")
	[ "$peak" -le 2147483648 ]
	[ "$(awk '$1 == "steps:" { print $2 }' <<<"$output")" = 15 ]
}

@test "merging turns pieces into far fewer copies" {
	cd "$BATS_FILE_TMPDIR"
	run vps-stage --budget 8GiB ablation.plan --stats
	before=$(awk '$1 == "copies_before_merging:" { print $2 }' <<<"$output")
	after=$(awk '$1 == "copies_after_merging:" { print $2 }' <<<"$output")
	[ "$after" -lt "$before" ]
	[ $((before / after)) -ge 5 ]
}

@test "a budget below the floor exits 2 naming the floor; a smaller budget makes more stages" {
	cd "$BATS_FILE_TMPDIR"
	expect_status 2 vps-stage --budget 1000 ablation.plan
	[[ "$output" == *"below the floor of 4096 bytes"* ]]
	big=$(vps-stage --budget 16GiB ablation.plan --stats | awk '$1 == "stages:" { print $2 }')
	small=$(vps-stage --budget 256MiB ablation.plan --stats | awk '$1 == "stages:" { print $2 }')
	[ "$small" -gt "$big" ]
	expect_status 2 vps-stage --budget 2XB ablation.plan
	[[ "$output" == *"unknown unit 'XB'"* ]]
}

@test "per-rank budgets: the smallest rules" {
	cd "$BATS_FILE_TMPDIR"
	printf 'vps: budgets\nversion: 1\nbudgets: [8GiB, 512MiB, 16GiB]\n' > b.yaml
	vps-stage --budgets b.yaml ablation.plan --stats > st.txt
	grep -q '^budget: 536870912$' st.txt
}

@test "a rank's part, a pipeline, and a tampered staged plan" {
	cd "$BATS_FILE_TMPDIR"
	vps-plan --transition gpt3-1.3b-pp-up | vps-stage --budget 1GiB --rank 3 - | vps-verify -q -
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=3,zero=1 -o b.layout
	vps-plan a.layout b.layout | vps-stage --budget 1MiB --yaml - -o s.yaml
	awk '/^    staging:/ && !done && $2 > 0 { sub(/[0-9]+$/, $2 + 8); done = 1 } { print }' s.yaml > bad.yaml
	expect_status 1 vps-verify bad.yaml
	[[ "$output" == *"is not 256-byte aligned"* ]]
	vps-plan a.layout b.layout --rank 1 -o r.plan
	expect_status 2 vps-stage --budget 1MiB --rank 2 r.plan
	[ "$output" = "vps-stage: rank 2, but the plan holds world rank 1's part only" ]
}

@test "a rank stages its own one-rank plan: the same transfers as the global staging's, stages left to the executors" {
	cd "$BATS_FILE_TMPDIR"
	vps-layout --model tiny-gpt --parallel tp=2,pp=2,dp=2,zero=1 -o ga.layout
	vps-layout --model tiny-gpt --parallel tp=1,pp=1,dp=3,zero=1 -o gb.layout
	vps-plan ga.layout gb.layout | vps-stage --budget 256KiB --rank 5 --yaml - -o g5.yaml
	vps-plan ga.layout gb.layout --rank 5 | vps-stage --budget 256KiB --yaml - -o r5.yaml
	vps-plan ga.layout gb.layout --rank 5 | vps-stage --budget 256KiB - --stats > r5.txt
	grep -qx 'cut: false' r5.txt
	grep -qx 'stages: 0' r5.txt
	grep -qx 'scope: 5' r5.txt
	# the transfers, unit for unit; only the stage numbers wait for the cut
	t() { awk '/^transfers:/ { on = 1 } /^frees:/ { on = 0 }
		   on { sub(/^- stage: -?[0-9]+$/, "-"); sub(/^  - piece: [0-9]+$/, "  -"); print }' "$1"; }
	[ -n "$(t r5.yaml)" ]
	diff <(t g5.yaml) <(t r5.yaml)
	grep -q '^stages: \[\]$' r5.yaml
	vps-verify -q r5.yaml
}

@test "out of memory: vps-verify exits 2 naming the file and what did not fit" {
	cd "$BATS_FILE_TMPDIR"
	# AddressSanitizer reserves terabytes of address space: no limit fits it
	! grep -qa __asan_init "$VPS_BIN/vps-verify" || skip "address space limits do not apply under ASan"
	# Qwen3-30B's 92,254 pieces take some 60 MB to hold; with 24 MiB of
	# address space the tool starts and the document does not fit
	vps-plan --transition qwen3-30b-s11-s12 | vps-stage --budget 1GiB - -o oom.staged
	run bash -c 'ulimit -v 24576; exec vps-verify oom.staged'
	[ "$status" -eq 2 ]
	[[ "$output" == "vps-verify: oom.staged: reading it: out of memory: what its "*" bytes describe does not fit" ]]
}

@test "out of memory while checking: vps-verify names what did not fit, in the library's words" {
	cd "$BATS_FILE_TMPDIR"
	! grep -qa __asan_init "$VPS_BIN/vps-verify" || skip "address space limits do not apply under ASan"
	[ -s oom.staged ] || vps-plan --transition qwen3-30b-s11-s12 | vps-stage --budget 1GiB - -o oom.staged
	# from too little to read it to enough to check it: each limit gives one
	# of three answers, and some give the checks' own
	local kb checking=0
	for kb in $(seq 24576 4096 131072); do
		run bash -c "ulimit -v $kb; exec vps-verify oom.staged"
		case $status:$output in
		0:"oom.staged: ok: "*) ;;
		2:"vps-verify: oom.staged: reading it: out of memory: what its "*" bytes describe does not fit") ;;
		2:"vps-verify: oom.staged: checking it: out of memory: "*" not fit")
			[[ $output =~ (do|does)\ not\ fit$ ]]
			[[ $output != *"(lib/"* ]]
			checking=$((checking + 1)) ;;
		*) echo "ulimit -v $kb: exit $status: $output" >&2; return 1 ;;
		esac
	done
	[ "$checking" -gt 0 ]
}

@test "--relay: forwards lie in stages after every receive; a forward moved before its arrival fails verification" {
	vps-layout --model tiny-llama --parallel tp=1,dp=1,zero=1 -o a.layout
	vps-layout --model tiny-llama --parallel tp=1,dp=4,zero=1 -o b.layout
	vps-plan --relay a.layout b.layout -o r.plan
	vps-stage --budget 64MiB r.plan --yaml -o s.yaml
	vps-verify s.yaml
	vps-stage --budget 4MiB r.plan -o small.staged
	vps-verify small.staged
	# steps past the direct ones (3 in a world of 4) carry the forwards
	grep -q '^  step: [4-6]$' s.yaml
	awk '/^- stage: / { s = $3 } /^  step: / && $2 > 3 && s < 3 { bad = 1 } END { exit bad }' s.yaml
	awk '/^- stage: [1-9]/ && !done && ++n == 4 { print "- stage: 1"; done = 1; next } { print }' s.yaml > bad.yaml
	expect_status 1 vps-verify bad.yaml
	[[ "$output" == *"passes on in stage 1 what it may receive as late as stage"* ]]
}

@test "a budget that makes thousands of stages is staged with a warning naming a budget for about 100" {
	vps-layout -q --model tiny-llama --parallel tp=2,dp=2,zero=1 -o a.layout
	vps-layout -q --model tiny-llama --parallel tp=1,pp=2,dp=2,zero=1 -o b.layout
	vps-plan -q a.layout b.layout -o ab.plan
	run vps-stage --budget 4KiB ab.plan -o small.staged
	[ "$status" -eq 0 ]
	[[ "${lines[0]}" =~ ^vps-stage:\ warning:\ ([0-9]+)\ stages\ within\ a\ 4.00\ KiB\ budget\;\ a\ budget\ of\ about\ (.+)\ gives\ about\ 100$ ]]
	[ "${BASH_REMATCH[1]}" -gt 5000 ]
	suggest=${BASH_REMATCH[2]}
	# the budget it names gives about that many, and no warning
	run vps-stage --budget "${suggest// /}" ab.plan -o big.staged
	[ "$status" -eq 0 ]
	[[ "$output" != *warning* ]]
	n=$(vps-stage --budget "${suggest// /}" ab.plan --stats | awk '$1 == "stages:" { print $2 }')
	[ "$n" -ge 50 ] && [ "$n" -le 200 ]
	# -q says nothing
	run vps-stage -q --budget 4KiB ab.plan -o small.staged
	[ "$status" -eq 0 ] && [ -z "$output" ]
}

@test "one stage, one transfer: the summary counts in the singular" {
	vps-layout -q --model tiny-llama --parallel tp=1 -o one.layout
	vps-plan -q one.layout one.layout -o same.plan
	run vps-stage --budget 1MiB same.plan -o same.staged
	[ "$status" -eq 0 ]
	[[ "$output" == "staged: 1 stage within a 1.00 MiB budget, peak 0 B a rank; 0 B moved in 1 transfer" ]]
}
