#!/usr/bin/env bats
# vps-layout as a user runs it.

load helpers

@test "parameter counts of the paper models equal Hugging Face's" {
	for pair in llama2-7b:6738415616 llama2-13b:13015864320 llama2-70b:68976648192 \
		qwen3-30b-a3b:30532122624 qwen3-235b-a22b:235093634560; do
		expect_status 0 vps-layout --model "${pair%%:*}" --stats --yaml
		[[ "$output" == *"parameters: ${pair#*:}"* ]]
	done
}

@test "an impossible configuration exits 2 naming the flag and the reason" {
	expect_status 2 vps-layout --model llama2-70b --parallel tp=3
	[ "$output" = "vps-layout: --parallel: tp=3 does not divide heads=64 of llama2-70b" ]
	expect_status 2 vps-layout --model llama-32b --parallel pp=8
	[[ "$output" == *"pp=8 does not divide layers=60 of llama-32b (give first= and last=)"* ]]
	expect_status 2 vps-layout --model qwen3-30b-a3b --parallel tp=4,pp=8,dp=1,ep=3
	[[ "$output" == *"ep=3 does not divide experts=128"* ]]
	expect_status 2 vps-layout --model tiny-llama --parallel tp=2,pp=2,dp=2 --devices /nonexistent
	[[ "$output" == "vps-layout: /nonexistent: No such file or directory" ]]
}
