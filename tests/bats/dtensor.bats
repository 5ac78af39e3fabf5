#!/usr/bin/env bats
# The PyTorch DTensor layout family (family=dtensor) through every tool:
# FSDP2, HSDP, TP, PP and EP as torchtitan applies them (make check-torch
# checks the placements against PyTorch's own code).

load helpers

@test "vps-layout lays out FSDP2's uneven shards and says so" {
	expect_status 0 vps-layout --model llama3-debug --parallel fsdp=3 --stats --yaml
	[[ "$output" == *'parallel: "dp_shard=3"'* ]]
	[[ "$output" == *"world: 3"* ]]
	[[ "$output" == *"states: [main_param, exp_avg, exp_avg_sq]"* ]]
	# torch.chunk: 683 + 683 + 682 vocabulary rows, and the last rank's
	# storage padded to 683
	expect_status 0 vps-layout --model llama3-debug --parallel dp_shard=3 --format tsv \
		--tensor embedding.word_embeddings.weight --state exp_avg
	[ "${lines[3]}" = "embedding.word_embeddings.weight	exp_avg	2	2	3	1	45	1366:2048,0:256	0	256,1	698368" ]
	expect_status 0 vps-layout --model llama3-debug --parallel dp_shard=3 --rank 2 --yaml
	[[ "$output" == *"family: dtensor"* ]]
	[[ "$output" == *"param: tok_embeddings.weight"* ]]
	[[ "$output" == *"elements: 174848"* ]] # 683 x 256, the padded storage
}

@test "HSDP holds two copies, TP and PP cut as torchtitan does" {
	expect_status 0 vps-layout --model llama3-debug --parallel dp_replicate=2,dp_shard=2 --stats --yaml
	[[ "$output" == *"copies: 2.0000"* ]]
	expect_status 0 vps-layout --model llama3-debug --parallel dp_shard=1,tp=2,pp=2 --format tsv \
		--tensor decoder.layers.3.self_attention.linear_proj.weight --state main_param
	# pipeline stage 1 (ranks 2, 3) holds layer 3; rowwise: columns cut
	[ "${lines[1]}" = "decoder.layers.3.self_attention.linear_proj.weight	main_param	2	2	2	1	1	0:256,0:128	0	128,1	131072" ]
	[ "${lines[2]}" = "decoder.layers.3.self_attention.linear_proj.weight	main_param	3	3	2	1	1	0:256,128:256	0	128,1	131072" ]
}

@test "a plan between two DTensor layouts moves the lower bound, stages and verifies" {
	vps-layout -q --model llama3-debug --parallel dp_shard=4 > a.layout
	vps-layout -q --model llama3-debug --parallel dp_replicate=2,dp_shard=2 > b.layout
	expect_status 0 vps-verify a.layout
	[[ "$output" == "a.layout: ok: llama3-debug: 4 ranks, 39 tensors x 3 states, "* ]]
	expect_status 0 vps-plan a.layout b.layout --stats --yaml
	[[ "$output" == *"moved_over_lower_bound: 1.000"* ]]
	vps-plan -q a.layout b.layout > ab.plan
	vps-stage -q --budget 4MiB ab.plan > ab.staged
	expect_status 0 vps-verify ab.staged
	[[ "$output" == "ab.staged: ok: "* ]]
	expect_status 0 vps-show -t a.layout ab.plan ab.staged
	[[ "${lines[0]}" == "a.layout: vps layout, model llama3-debug, world 4, hash "* ]]
	expect_status 0 vps-show --json a.layout
	[[ "$output" == *'"family": "dtensor"'* ]]
}

@test "a DTensor layout reads back from YAML and binary with its hash" {
	vps-layout -q --model llama3-debug --parallel dp_shard=2,tp=2 --rank 3 > a.bin
	vps-layout -q --model llama3-debug --parallel dp_shard=2,tp=2 --rank 3 --yaml > a.yaml
	h1=$(vps-show -t a.bin | sed 's/.*hash //; s/,.*//')
	h2=$(vps-show -t a.yaml | sed 's/.*hash //; s/,.*//')
	[ "$h1" = "$h2" ]
	vps-show a.bin > back.yaml
	cmp back.yaml a.yaml
}

@test "a switch between DTensor layouts runs, every element checked" {
	expect_status 0 "$TOP/scripts/demo.sh" --model "$TOP/tests/torch/models/qwen3-moe-e6.yaml" \
		--from dp_shard=4 --to dp_shard=2,tp=2 --back --np 4 --global-batch 8
	[[ "$output" == *"digest: match"* ]]
	[[ "$output" == *"samples: 56 read, each exactly once"* ]]
}

@test "what the family does not lay out is refused by name" {
	expect_status 2 vps-layout --model llama3-debug --parallel fsdp=2,zero=1
	[ "$output" = "vps-layout: --parallel: zero, etp, first, last, bucket, grad and grouped_gemm are Megatron's (family=megatron); a DTensor mesh has dp_replicate, dp_shard, cp, tp, pp, ep and vpp" ]
	# torchtitan's optimizer is PyTorch's AdamW: Megatron's optimizer keys are refused
	expect_status 2 vps-layout --model llama3-debug --parallel fsdp=2,optimizer=muon
	[ "$output" = "vps-layout: --parallel: optimizer=muon is Megatron's (family=megatron); family=dtensor lays out PyTorch's Adam with fp32 moments (exp_avg, exp_avg_sq), as torchtitan builds it" ]
	expect_status 2 vps-layout --model llama3-debug --parallel fsdp=2,exp_avg=bf16
	[[ "$output" == *": exp_avg=bf16 is Megatron's (family=megatron)"* ]]
	vps-layout -q --model llama3-debug --parallel fsdp=2,optimizer=adam > adam.layout
	# the states it does not hold, and why
	expect_status 2 vps-layout -i adam.layout --tensor embedding.word_embeddings.weight --state param
	[ "$output" = "vps-layout: this layout holds no param (family=dtensor holds main_param, exp_avg and exp_avg_sq)" ]
	expect_status 2 vps-layout -i adam.layout --tensor embedding.word_embeddings.weight --state momentum_buffer
	[[ "$output" == *"holds no momentum_buffer (family=dtensor holds main_param, exp_avg and exp_avg_sq)" ]]
	expect_status 2 vps-layout --model tiny-gpt --parallel fsdp=2
	[[ "$output" == *"tiny-gpt is not a torchtitan decoder (RMSNorm, SwiGLU, RoPE, no biases)"* ]]
	vps-layout -q --model llama3-debug --parallel dp=2,zero=1 > m.layout
	vps-layout -q --model llama3-debug --parallel fsdp=2 > d.layout
	expect_status 2 vps-plan m.layout d.layout
	[[ "$output" == *"the layouts are of different families (megatron, dtensor)"* ]]
}
