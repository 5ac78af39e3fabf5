#!/usr/bin/env bats
# tests/megatron/check_megatron.py (make check-megatron runs its matrix):
# what it says when a layout is not Megatron-Core's, and its usage.

load helpers

setup() {
	cd "$BATS_TEST_TMPDIR" || exit 1
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
