#!/usr/bin/env bats
# DeepSeek-V3-style models as a user meets them: a Hugging Face model
# directory, its parameter count, the layouts and plans of a large job.
# The end-to-end switch is in exec.bats (tiny-deepseek, tcp and ipc).

load helpers

v3_dir() { # DIR [moe_layer_freq]
	mkdir -p "$1"
	cat > "$1/config.json" <<JSON
{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
 "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
 "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
 "moe_intermediate_size": 2048, "moe_layer_freq": ${2:-1}, "n_group": 8,
 "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
 "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
 "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
 "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
 "rope_scaling": {"factor": 40, "type": "yarn"}, "rope_theta": 10000,
 "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_method": "noaux_tc",
 "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280}
JSON
}

# Hugging Face's checkpoint holds 684,489,845,504 ("685B"): 671,026,419,200
# for the main model and layer 61, the MTP layer (num_nextn_predict_layers).
# Megatron's MTP layer shares the embedding and output layer that layer 61
# stores again (2 x 129280 x 7168), and the routers' e_score_correction_bias
# (59 x 256 with the MTP layer's) is a module buffer, not a parameter:
# vps holds and moves it as the module_buffer state.
@test "DeepSeek-V3 from its Hugging Face directory: the model file's parameters, 685B less the router bias and layer 61's copies" {
	v3_dir hub/DeepSeek-V3
	expect_status 0 vps-layout --model hub/DeepSeek-V3 --parallel tp=8,pp=16,dp=2,ep=16,etp=1,first=3,last=2,zero=1 --stats
	[[ "$output" == *"model: DeepSeek-V3"* ]]
	[[ "$output" == *"parameters: $((684489845504 - 59 * 256 - 2 * 129280 * 7168))"* ]]
	expect_status 0 vps-layout --model deepseek-v3 --stats
	[[ "$output" == *"parameters: $((684489845504 - 59 * 256 - 2 * 129280 * 7168))"* ]]
	[[ "$output" == *"module_buffers: $((59 * 256))"* ]]
	expect_status 0 vps-layout --model tiny-llama --stats
	[[ "$output" != *module_buffers* ]]
}

@test "DeepSeek-V3: a switch of tp, pp and ep plans and verifies" {
	expect_status 0 vps-layout --model deepseek-v3 --parallel tp=8,pp=16,dp=2,ep=16,etp=1,first=3,last=2,zero=1 -o a
	expect_status 0 vps-layout --model deepseek-v3 --parallel tp=4,pp=8,dp=8,ep=32,etp=1,first=5,last=8,zero=1 -o b
	expect_status 0 vps-verify a
	expect_status 0 vps-verify b
	expect_status 0 vps-plan a b -o p
	expect_status 0 vps-verify p
	# the routers' expert_bias moves with the layers: b's stage 0 gains
	# layers 3-4, whose bias (fp32 x 256) a's stage 1 holds on each rank
	expect_status 0 vps-plan --transfers p --rank 0 --state module_buffer --format tsv
	[[ "$output" == *$'\trecv\t'*$'\tdecoder.layers.3.mlp.router.expert_bias\tmodule_buffer\t0:256\t1024\t'* ]]
	[[ "$output" == *$'\tdecoder.layers.4.mlp.router.expert_bias\tmodule_buffer\t'* ]]
	[[ "$output" != *"decoder.layers.5.mlp"* ]]
	expect_status 0 vps-layout -i b --tensor decoder.layers.60.mlp.router.expert_bias --format tsv
	[[ "$output" == *$'\tmodule_buffer\t'* ]]
}

@test "a Hugging Face DeepSeek config with MoE every other layer is refused, naming the key" {
	v3_dir hub/odd 2
	expect_status 2 vps-layout --model hub/odd --parallel tp=8
	[[ "$output" == *"moe_layer_freq"*"only 1"* ]]
}

@test "multi-latent attention: tp must divide the heads; the dense layers' ffn too" {
	expect_status 2 vps-layout --model tiny-deepseek --parallel tp=3
	[[ "$output" == *"tp=3 does not divide heads=4 of tiny-deepseek"* ]]
	sed 's/^ffn: 128/ffn: 126/' "$TOP/configs/models/tiny-deepseek.yaml" > m.yaml
	expect_status 2 vps-layout --model ./m.yaml --parallel tp=4
	[[ "$output" == *"tp=4 does not divide ffn=126"* ]]
}

@test "multi-token prediction with learned positions is refused, with the reason, as Megatron-LM refuses it" {
	sed -e 's/^position: rope/position: learned\nmax_positions: 128/' "$TOP/configs/models/tiny-deepseek.yaml" > m.yaml
	expect_status 2 vps-layout --model ./m.yaml --parallel tp=2 --stats
	[[ "$output" == "vps-layout: ./m.yaml: line "*": multi-token prediction (mtp_layers=1) needs rope positions: Megatron-LM refuses it with learned absolute position embeddings" ]]
	# without the MTP layer the same model is laid out
	sed -i '/^mtp_layers:/d' m.yaml
	expect_status 0 vps-layout --model ./m.yaml --parallel tp=2 --stats
}
