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

# A model as downloaded from the Hugging Face hub: a directory with a
# config.json (and weights vps never reads).
hf_dir() {
	mkdir -p "$1"
	cat > "$1/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
 "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-05,
 "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}
JSON
}

@test "--model takes a Hugging Face model directory, named by the directory" {
	hf_dir hub/Meta-Llama-3-8B
	for m in hub/Meta-Llama-3-8B hub/Meta-Llama-3-8B/ "$PWD/hub/Meta-Llama-3-8B" hub/Meta-Llama-3-8B/config.json; do
		expect_status 0 vps-layout --model "$m" --parallel tp=2,pp=2,dp=2,zero=1 --stats
		[[ "$output" == *"model: Meta-Llama-3-8B"* ]]
		[[ "$output" == *"parameters: 8030261248"* ]]
	done
	# a bare name: a known model first, else a directory here
	cd hub
	expect_status 0 vps-layout --model Meta-Llama-3-8B --stats
	[[ "$output" == *"parameters: 8030261248"* ]]
	cd Meta-Llama-3-8B
	expect_status 0 vps-layout --model . --parallel tp=8 -o l
	expect_status 0 vps-verify l
	[[ "$output" == "l: ok: Meta-Llama-3-8B: 8 ranks, "* ]]
	mkdir -p ../llama2-7b
	expect_status 0 vps-layout --model llama2-7b --stats
	[[ "$output" == *"parameters: 6738415616"* ]]
}

@test "a directory without config.json, and an unknown model name, say what --model takes" {
	mkdir empty
	expect_status 2 vps-layout --model empty/ --parallel tp=2
	[ "$output" = "vps-layout: --model: empty/: a directory without config.json (a Hugging Face model directory has one)" ]
	expect_status 2 vps-layout --model llama3-8b --parallel tp=2
	# the known ones are the models on the search path
	local known
	known=$(cd "$TOP/configs/models" && ls -- *.yaml | sed 's/\.yaml$//' | LC_ALL=C sort | paste -sd, | sed 's/,/, /g')
	[[ "$output" == "vps-layout: --model: no model named 'llama3-8b'; known: $known; or a model file, a Hugging Face config.json or its directory (looked for llama3-8b.yaml in "* ]]
}

@test "grouped_gemm=1 names experts as TEGroupedMLP does, and a dense model refuses it" {
	expect_status 0 vps-layout --model tiny-qwen3-moe --parallel tp=2,dp=3,ep=2,etp=1,zero=1,grouped_gemm=1 \
		--rank 2 --yaml -o grouped.yaml
	# rank 2 is EP rank 0: local experts 0..3 are global experts 0..3
	grep -q 'tensor: decoder.layers.5.mlp.experts.local_experts.1.linear_fc1.weight$' grouped.yaml
	grep -q 'param: decoder.layers.5.mlp.experts.linear_fc1.weight1$' grouped.yaml
	grep -q 'param: decoder.layers.0.mlp.experts.linear_fc2.weight3$' grouped.yaml
	! grep -q 'param: .*local_experts' grouped.yaml
	grep -q 'grouped_gemm: true' grouped.yaml
	# the layout reads back as it was written
	expect_status 0 vps-layout -i grouped.yaml --stats --yaml
	[[ "$output" == *'parallel: "tp=2,pp=1,dp=3,ep=2,etp=1,vpp=1,zero=1,grouped_gemm=1"'* ]]
	expect_status 2 vps-layout --model tiny-llama --parallel tp=2,grouped_gemm=1
	[ "$output" = "vps-layout: --parallel: grouped_gemm applies to MoE models only (tiny-llama is dense)" ]
}

@test "--parallel: a spec's fault and a name that names nothing say the flag; a file's fault says the file" {
	expect_status 2 vps-layout --model tiny-llama --parallel tp=2,pp=x
	[ "$output" = "vps-layout: --parallel: pp=x: expected an integer in [1, 1048576]" ]
	expect_status 2 vps-layout --model tiny-llama --parallel no-such
	[ "$output" = "vps-layout: --parallel: 'no-such' is neither KEY=VALUE,... nor a known configuration (no-such.yaml)" ]
	printf 'vps: parallel\nversion: 1\ntp: x\n' > p.yaml
	expect_status 2 vps-layout --model tiny-llama --parallel ./p.yaml
	[ "$output" = "vps-layout: ./p.yaml: line 3: tp: 'x' is not an integer" ]
	expect_status 2 vps-plan --topology no-such --transition gpt3-1.3b-tp-up
	[[ "$output" == "vps-plan: --topology: no topology named 'no-such'; known: "* ]]
}

@test "a named configuration of another model is refused with --model, naming both; one rank is one rank" {
	expect_status 2 vps-layout --parallel llama2-13b-4-4-2 --model llama2-7b -o x.layout
	[ "${lines[0]}" = "vps-layout: --parallel: llama2-13b-4-4-2 is llama2-13b's configuration, and --model is llama2-7b (leave out --model, or give the shape as tp=..,pp=..,dp=..)" ]
	[ ! -e x.layout ]
	# its own model, named or not, is accepted
	vps-layout -q --parallel llama2-13b-4-4-2 --model llama2-13b -o x.layout
	vps-layout -q --parallel llama2-13b-4-4-2 -o y.layout
	cmp x.layout y.layout
	run vps-layout --model tiny-llama --parallel tp=1 -o one.layout
	[[ "${lines[0]}" == "layout: tiny-llama on 1 rank ("* ]]
}

@test "the optimizer: its states, their dtypes and sharding in --stats and --tensor; what Megatron refuses, with its rule" {
	expect_status 0 vps-layout --model tiny-llama --parallel dp=2,zero=1 --stats
	[[ "$output" == *"states: [param, main_param, exp_avg, exp_avg_sq]"* ]]
	[[ "$output" == *"dtypes: {param: bf16, main_param: fp32, exp_avg: fp32, exp_avg_sq: fp32}"* ]]
	[[ "$output" == *"optimizer: adam"* ]]
	[[ "$output" != *"layer_wise"* ]]
	expect_status 0 vps-layout --model tiny-llama --parallel dp=2,zero=1,optimizer=muon --stats
	[[ "$output" == *"states: [param, main_param, exp_avg, exp_avg_sq, momentum_buffer]"* ]]
	[[ "$output" == *$'optimizer: muon\nscalar_optimizer: adam\nlayer_wise: true'* ]]
	expect_status 0 vps-layout --model tiny-llama --parallel dp=2,zero=1,precision_aware=1,exp_avg=bf16 --stats
	[[ "$output" == *"dtypes: {param: bf16, main_param: int16, exp_avg: bf16, exp_avg_sq: fp32}"* ]]
	# Muon holds each matrix whole on one DP rank: layer 6's on rank 1, at
	# the start of its shard of the layer-wise buffer
	expect_status 0 vps-layout --model tiny-llama --parallel dp=2,zero=1,optimizer=muon \
		--tensor decoder.layers.6.mlp.linear_fc1.weight --state momentum_buffer --format tsv
	[ "${lines[1]}" = $'decoder.layers.6.mlp.linear_fc1.weight\tmomentum_buffer\t1\t1\t1\t1\t6\t0:2,0:688,0:256\t0\t176128,256,1\t1409024' ]
	[ "${#lines[@]}" -eq 2 ]
	expect_status 2 vps-layout --model tiny-llama --parallel dp=2,optimizer=sgd --tensor 'decoder.layers.0.*' --state exp_avg
	[ "$output" = "vps-layout: this layout holds no exp_avg (sgd keeps none)" ]
	expect_status 2 vps-layout --model tiny-llama --parallel dp=2,zero=1,optimizer=sgd
	[ "$output" = "vps-layout: --parallel: optimizer=sgd with zero=1: Megatron-Core's DistributedOptimizer takes Adam, its CPU-offload wrapper or an optimizer with an init_state_fn, and SGD has none (distrib_optimizer.py DistributedOptimizer.__init__); sgd runs with zero=0" ]
	expect_status 2 vps-layout --model tiny-llama --parallel dp=2,zero=1,optimizer=adamw
	[ "$output" = "vps-layout: --parallel: unknown optimizer 'adamw' (adam, sgd, muon, lion)" ]
	expect_status 2 vps-layout --model tiny-qwen3-moe --parallel dp=2,zero=1,exp_avg=bf16
	[[ "$output" == *"exp_avg=bf16 and exp_avg_sq=bf16 need precision_aware=1"* ]]
}

@test "offload=F: the hybrid optimizer's host part of each shard, in --stats, the rank's buffers and --tensor; refused where Megatron refuses it" {
	expect_status 0 vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1,offload=0.5,precision_aware=1 --stats
	[[ "$output" == *'parallel: "tp=2,pp=1,dp=2,ep=1,etp=2,vpp=1,zero=1,offload=0.5"'* ]]
	[[ "$output" == *"dtypes: {param: bf16, main_param: fp32, exp_avg: fp32, exp_avg_sq: fp32}"* ]]
	[[ "$output" == *$'optimizer: adam\noffload: 0.5'* ]]
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1,offload=0.5 --rank 1 --yaml > r1.yaml
	[ "$(grep -c '^    host: true$' r1.yaml)" -eq 3 ]
	# buffers in order: param, main_param, exp_avg, exp_avg_sq, then the host
	# ones of the last three; the last layer comes first in the buffer, so
	# its fc1 (a matrix) is on the host (buffer 5), its norm weight (1-D,
	# in the wd_mult=0 group that the hybrid optimizer takes after the
	# matrices) on the GPU (buffer 2)
	vps-layout --model tiny-llama --parallel tp=2,dp=2,zero=1,offload=0.5 \
		--tensor 'decoder.layers.7.mlp.linear_fc1.*' --state exp_avg --format tsv > t.tsv
	[ "$(cut -f1,3,7,9 t.tsv | sed 1d | tr '\t\n' ' |')" = "decoder.layers.7.mlp.linear_fc1.layer_norm_weight 0 2 256|decoder.layers.7.mlp.linear_fc1.layer_norm_weight 1 2 256|decoder.layers.7.mlp.linear_fc1.weight 0 5 219136|decoder.layers.7.mlp.linear_fc1.weight 1 5 219136|" ]
	expect_status 2 vps-layout --model tiny-llama --parallel dp=2,zero=0,offload=0.5
	[[ "$output" == *"offload needs optimizer=adam and zero=1"* ]]
	expect_status 2 vps-layout --model tiny-llama --parallel dp=2,zero=1,offload=2
	[ "$output" = "vps-layout: --parallel: offload=2: expected a fraction in [0, 1] (--optimizer-offload-fraction)" ]
}
