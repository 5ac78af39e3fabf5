#!/usr/bin/env bats
# tests/megatron/check_megatron.py (make check-megatron runs its matrix):
# what it says when a layout is not Megatron-Core's, and its usage.

load helpers

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
	framework_job
	"$PY" -c 'import megatron.core' 2>/dev/null || skip "$PY has no megatron-core (make venv makes the test environment)"
}

@test "check_megatron.py names the first rank, parameter and field where vps's layout is not Megatron's" {
	# Megatron builds one bucket; vps is asked for buckets of 100,000 elements
	expect_status 1 "$PY" "$TOP/tests/megatron/check_megatron.py" -k 'tiny-llama tp=2,dp=2,zero=1' \
		--vps tp=2,dp=2,zero=1,bucket=100000
	[[ "$output" == *"check-megatron: tiny-llama tp=2,dp=2,zero=1 (megatron-core 0.19."*", vps tp=2,dp=2,zero=1,bucket=100000): rank 0 chunk 0 dense buffer embedding.word_embeddings.weight bucket: Megatron-Core 0, vps 16"* ]]
	[[ "$output" != *"every rank equal"* ]]
	# without ZeRO-1 vps holds whole fp32 copies where Megatron's optimizer shards
	expect_status 1 "$PY" "$TOP/tests/megatron/check_megatron.py" -k 'tiny-llama tp=2,dp=2,zero=1' --vps tp=2,dp=2
	[[ "$output" == *"rank 0 chunk 0 dense buffer embedding.word_embeddings.weight main_param buffer sharded: Megatron-Core True, vps False"* ]]
}

@test "check_megatron.py: one configuration, its summary line" {
	run "$PY" "$TOP/tests/megatron/check_megatron.py" -k 'tiny-gpt tp=2,pp=2,dp=2,zero=1'
	echo "$output"
	[ "$status" -eq 0 ]
	[ "${lines[-1]}" = "1 configurations, every rank equal to Megatron-Core" ]
}

@test "check_megatron.py: bad arguments exit 2" {
	expect_status 2 "$PY" "$TOP/tests/megatron/check_megatron.py" -k no-such-model
	[[ "$output" == *"check_megatron.py: -k no-such-model: no configuration matches"* ]]
	expect_status 2 "$PY" "$TOP/tests/megatron/check_megatron.py" -k tiny-llama --vps tp=2
	[[ "$output" == *"check_megatron.py: --vps: -k selects "*" configurations, not one"* ]]
	expect_status 2 "$PY" "$TOP/tests/megatron/check_megatron.py" -k 'tiny-llama tp=2,dp=2,zero=1' --vps tp=3
	[[ "$output" == *"check_megatron.py: tiny-llama tp=3: parallel: tp=3 does not divide heads=8 of tiny-llama"* ]]
	expect_status 2 "$PY" "$TOP/tests/megatron/check_megatron.py" -k 'tiny-llama tp=2,dp=2,zero=1' --vps tp=2
	[[ "$output" == *"has a world of 2 ranks"* ]]
}

# tests/megatron/check_switch.py (make check-megatron runs it whole):
# vps.megatron switching a Megatron-Core job, as README and vps(7) show it.

@test "README's and vps(7)'s Megatron-Core fragments are check_switch.py's own lines" {
	run python3 - "$TOP" <<-'PY'
	import sys
	top = sys.argv[1]
	sys.path.insert(0, top + "/tests/bats")
	import examples
	mine = {l.strip() for l in open(top + "/tests/megatron/check_switch.py")}
	n = 0
	for page in ("README.md", "man/vps.7"):
	    for b in examples.blocks_of(top + "/" + page):
	        if b.kind == "not run" and "Megatron-Core training loop" in b.why:
	            n += 1
	            for line in b.text:
	                if line.strip() not in ("", "...") and line.strip() not in mine:
	                    sys.exit("%s: not a line of check_switch.py: %s" % (b.where(), line.strip()))
	if n != 2:
	    sys.exit("%d Megatron-Core fragments, expected one in each page" % n)
	PY
	echo "$output"
	[ "$status" -eq 0 ]
	# the lines that make the job switchable are among them
	grep -q 'job = vps.megatron.Job(reg, layout, rank, model, optimizer)' "$TOP/README.md"
	grep -q 'model, optimizer, carried = job.switch(new_layout, rank, vps.Training(' "$TOP/man/vps.7"
}

@test "check_switch.py: an executor that dies stops the run, which says so and leaves nothing in /dev/shm" {
	ls /dev/shm | grep '^vps-mcore-' > before || true
	# the tools of the fault tests (helpers.bash): the executors inject VPS_FAULT
	VPS_BIN=$VPS_FAULT_BIN VPS_FAULT=exit:0 expect_status 1 "$PY" "$TOP/tests/megatron/check_switch.py" --steps 5 --every 3 \
		--model micro-gpt
	[[ "$output" == *"check_switch.py: micro-gpt: vps-exec rank "*" exited with status 3"* ]]
	run shm_left vps-mcore before
	echo "left: $output"
	[ -z "$output" ]
}

@test "check_switch.py: a switch that fails leaves the Job as it was, the hand-over made during the transfer undone" {
	# every executor shuts its data connections at the first switch's network stage: the
	# ranks' Jobs have handed over (groups, gradients) while the executors ran, and must undo it
	VPS_BIN=$VPS_FAULT_BIN VPS_FAULT=cut:1 run "$PY" "$TOP/tests/megatron/check_switch.py" --steps 5 --every 3 \
		--model micro-gpt --optimizer adam --failed-switch
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"micro-gpt on 4 ranks: the switch at step 3 failed on every rank (rank 0: vps.PeerFailed: "* ]]
	[[ "$output" == *"and the job trained on as it was: its model, optimizer, process groups and state, the static run's loss at every one of 5 steps"* ]]
}

@test "megatron_job.py --failed-switch (gpu-check.sh's, here on the CPU): the executor dies, the job trains on as it was" {
	VPS_BIN=$VPS_FAULT_BIN VPS_FAULT=exit:0 run "$PY" "$TOP/tests/gpu/megatron_job.py" --device cpu --failed-switch
	echo "$output"
	[ "$status" -eq 0 ]
	[[ "$output" == *"vps-exec died at the switch at step 3 (exit 3) and Job.switch raised (vps.PeerFailed: "* ]]
	[[ "$output" == *"the job trained on as it was: its state equal bit for bit, its loss the static run's (equal at every step)"* ]]
	VPS_BIN=$VPS_BIN expect_status 1 "$PY" "$TOP/tests/gpu/megatron_job.py" --device cpu --failed-switch --steps 2
	[[ "$output" == *"the switch did not fail"* ]]
}

@test "check_switch.py: bad arguments exit 2" {
	expect_status 2 "$PY" "$TOP/tests/megatron/check_switch.py" --steps 0
	[[ "$output" == *"--steps and --every must be at least 1"* ]]
	expect_status 2 "$PY" "$TOP/tests/megatron/check_switch.py" --no-such-option
	expect_status 2 "$PY" "$TOP/tests/megatron/check_switch.py" --model no-such-job
}

# tests/megatron/check_pretrain.py (make check-megatron runs it whole):
# Megatron-LM's pretrain() switched by vps.megatron_training.

@test "README's and vps(7)'s pretrain_gpt.py fragments are tests/megatron/pretrain_gpt.py's own lines" {
	run python3 - "$TOP" <<-'PY'
	import sys
	top = sys.argv[1]
	sys.path.insert(0, top + "/tests/bats")
	import examples
	mine = {l.strip() for l in open(top + "/tests/megatron/pretrain_gpt.py")}
	n = 0
	for page in ("README.md", "man/vps.7"):
	    for b in examples.blocks_of(top + "/" + page):
	        if b.kind == "not run" and "Megatron-LM's pretrain_gpt.py" in b.why:
	            n += 1
	            for line in b.text:
	                if line.strip() not in ("", "...") and line.strip() not in mine:
	                    sys.exit("%s: not a line of pretrain_gpt.py: %s" % (b.where(), line.strip()))
	if n != 2:
	    sys.exit("%d pretrain_gpt.py fragments, expected one in each page" % n)
	PY
	echo "$output"
	[ "$status" -eq 0 ]
	# the two lines that make the job switchable are among them
	grep -q 'args = parse_and_validate_args(extra_args_provider=vps_mt.add_arguments,' "$TOP/README.md"
	grep -q 'vps_mt.pretrain(full_config, train_valid_test_datasets_provider, ModelType.encoder_or_decoder,' "$TOP/man/vps.7"
}

@test "check_pretrain.py: bad arguments exit 2" {
	expect_status 2 "$PY" "$TOP/tests/megatron/check_pretrain.py" -k no-such-job
	[[ "$output" == *"invalid choice: 'no-such-job'"* ]]
	expect_status 2 "$PY" "$TOP/tests/megatron/check_pretrain.py" --no-such-option
}
