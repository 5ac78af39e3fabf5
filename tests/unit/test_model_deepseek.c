/* DeepSeek-V3-style models: multi-latent attention, shared experts, dense
 * first layers and the router's expert bias, checked on cases counted by
 * hand from Megatron-LM's source (multi_latent_attention.py, moe_layer.py,
 * shared_experts.py, router.py) and Hugging Face's counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "io/doc.h"
#include "util/hash.h"
#include "util/internal.h"
#include "jobs.h"
#include "vps/layout.h"
#include "vps/model.h"
#include "vps/parallel.h"
#include "vps/plan.h"
#include "vps/verify.h"

/* deepseek-ai/DeepSeek-V3's config.json, less quantization_config and
 * auto_map (which vps ignores like any key it does not read). */
static const char v3_config[] =
	"{\n"
	"  \"architectures\": [\"DeepseekV3ForCausalLM\"],\n"
	"  \"attention_bias\": false,\n"
	"  \"attention_dropout\": 0.0,\n"
	"  \"aux_loss_alpha\": 0.001,\n"
	"  \"bos_token_id\": 0,\n"
	"  \"eos_token_id\": 1,\n"
	"  \"ep_size\": 1,\n"
	"  \"first_k_dense_replace\": 3,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 7168,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 18432,\n"
	"  \"kv_lora_rank\": 512,\n"
	"  \"max_position_embeddings\": 163840,\n"
	"  \"model_type\": \"deepseek_v3\",\n"
	"  \"moe_intermediate_size\": 2048,\n"
	"  \"moe_layer_freq\": 1,\n"
	"  \"n_group\": 8,\n"
	"  \"n_routed_experts\": 256,\n"
	"  \"n_shared_experts\": 1,\n"
	"  \"norm_topk_prob\": true,\n"
	"  \"num_attention_heads\": 128,\n"
	"  \"num_experts_per_tok\": 8,\n"
	"  \"num_hidden_layers\": 61,\n"
	"  \"num_key_value_heads\": 128,\n"
	"  \"num_nextn_predict_layers\": 1,\n"
	"  \"q_lora_rank\": 1536,\n"
	"  \"qk_nope_head_dim\": 128,\n"
	"  \"qk_rope_head_dim\": 64,\n"
	"  \"rms_norm_eps\": 1e-06,\n"
	"  \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, \"mscale\": 1.0,\n"
	"                   \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096,\n"
	"                   \"type\": \"yarn\"},\n"
	"  \"rope_theta\": 10000,\n"
	"  \"routed_scaling_factor\": 2.5,\n"
	"  \"scoring_func\": \"sigmoid\",\n"
	"  \"tie_word_embeddings\": false,\n"
	"  \"topk_group\": 4,\n"
	"  \"topk_method\": \"noaux_tc\",\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.46.3\",\n"
	"  \"use_cache\": true,\n"
	"  \"v_head_dim\": 128,\n"
	"  \"vocab_size\": 129280\n"
	"}\n";

/* tiny-deepseek.yaml as a Hugging Face config: n_shared_experts 2 of 32 */
static const char tiny_config[] =
	"{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 4,\n"
	" \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"q_lora_rank\": 48, \"kv_lora_rank\": 32,\n"
	" \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, \"intermediate_size\": 128,\n"
	" \"moe_intermediate_size\": 32, \"n_routed_experts\": 8, \"n_shared_experts\": 2,\n"
	" \"first_k_dense_replace\": 2, \"moe_layer_freq\": 1, \"vocab_size\": 500,\n"
	" \"num_nextn_predict_layers\": 1, \"tie_word_embeddings\": false}\n";

static void load(struct vps_model *m, const char *name)
{
	CHECK_OK(vps_model_load(m, name, CONFIGS "/models"));
}

static uint32_t tensor_id(const struct vps_model *m, const char *name)
{
	uint32_t id = UINT32_MAX;
	CHECK_OK(vps_model_find_tensor(m, name, &id));
	return id;
}

/* Hugging Face's DeepSeek-V3 checkpoint holds 671,026,419,200 parameters
 * besides the MTP layer 61 (which its model does not build), the 58 x 256
 * e_score_correction_bias included. By module, per layer: attention
 * 187,107,328 (q_a 1536x7168, q_a_layernorm 1536, q_b 24576x1536,
 * kv_a_with_mqa 576x7168, kv_a_layernorm 512, kv_b 32768x512, o 7168x16384)
 * and two norms of 7168; 3 dense MLPs of 3 x 7168 x 18432; 58 MoE layers
 * of 257 experts of 3 x 7168 x 2048 (256 routed + the shared one) and a
 * gate of 256 x 7168; embeddings and head 2 x 129280 x 7168; final norm.
 * Layer 61, the MTP layer, is an MoE layer with enorm, hnorm, eh_proj
 * 7168 x 14336 and shared_head.norm (Megatron's final_layernorm), plus its
 * own embed_tokens and shared_head.head, which in Megatron are the
 * embedding (a copy on the last stage) and output_layer: 684,489,845,504
 * in all, the "685B" of the model card. */
TEST(deepseek_v3_counts_hugging_faces_671b)
{
	struct vps_model hf, yaml;
	CHECK_OK(vps_model_parse(&hf, "DeepSeek-V3/config.json", v3_config, sizeof(v3_config) - 1));
	load(&yaml, "deepseek-v3");
	int64_t attention = 187107328, norms = 2 * 7168, dense = 3LL * 7168 * 18432, expert = 3LL * 7168 * 2048;
	int64_t gate = 256 * 7168, emb = 2LL * 129280 * 7168;
	int64_t moe_layer = attention + norms + 257 * expert + gate;
	int64_t want = 61 * (attention + norms) + 3 * dense + 58 * (257 * expert + gate) + emb + 7168;
	int64_t mtp = 3 * 7168 + 7168LL * 14336 + moe_layer;
	CHECK_EQ(hf.mtp_layers, 1);
	CHECK_EQ(vps_model_parameters(&hf), want + mtp);
	CHECK_EQ(vps_model_module_buffers(&hf), 59 * 256);
	CHECK_EQ(vps_model_parameters(&hf) + vps_model_module_buffers(&hf) + emb, 684489845504LL);
	CHECK_EQ(vps_model_hash(&hf), vps_model_hash(&yaml));
	CHECK_EQ(vps_model_parameters(&yaml), want + mtp);
	CHECK(strcmp(hf.name, "DeepSeek-V3") == 0);
	/* the main model alone is Hugging Face's DeepseekV3ForCausalLM */
	hf.mtp_layers = 0;
	CHECK_EQ(vps_model_parameters(&hf), want);
	CHECK_EQ(vps_model_parameters(&hf) + vps_model_module_buffers(&hf), 671026419200LL);
}

/* deepseek-ai/DeepSeek-V2-Lite's config.json, the keys vps reads: no query
 * compression (q_lora_rank null), 64 routed experts of which 6 a token, 2
 * shared, layer 0 dense. */
static const char v2_lite_config[] =
	"{\"model_type\": \"deepseek_v2\", \"hidden_size\": 2048, \"num_hidden_layers\": 27,\n"
	" \"num_attention_heads\": 16, \"num_key_value_heads\": 16, \"q_lora_rank\": null, \"kv_lora_rank\": 512,\n"
	" \"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"intermediate_size\": 10944,\n"
	" \"moe_intermediate_size\": 1408, \"n_routed_experts\": 64, \"n_shared_experts\": 2,\n"
	" \"num_experts_per_tok\": 6, \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"topk_method\": \"greedy\",\n"
	" \"vocab_size\": 102400, \"tie_word_embeddings\": false}\n";

/* MLA without query compression and with the q/kv norms (DeepSeek-V2-Lite):
 * since core 0.19 Megatron builds linear_q_proj as a norm-fused column
 * parallel linear (mla_qk_norm_config.py, _resolve_mla_qk_layernorm: with
 * q_lora_rank None the Q norm can only be fused there), so the layer
 * registers linear_q_proj.layer_norm_weight [hidden], a norm of the hidden
 * state, just before linear_q_proj.weight; replicated over TP like every
 * norm. With query compression the Q norm stays on linear_q_up_proj. */
TEST(mla_without_query_compression_fuses_the_q_norm_into_linear_q_proj)
{
	struct vps_model m;
	CHECK_OK(vps_model_parse(&m, "DeepSeek-V2-Lite/config.json", v2_lite_config, sizeof(v2_lite_config) - 1));
	CHECK_EQ(m.q_lora_rank, 0);
	CHECK(m.qk_norm);
	uint32_t ln = tensor_id(&m, "decoder.layers.26.self_attention.linear_q_proj.layer_norm_weight");
	CHECK_EQ(ln + 1, tensor_id(&m, "decoder.layers.26.self_attention.linear_q_proj.weight"));
	CHECK_EQ(ln - 1, tensor_id(&m, "decoder.layers.26.self_attention.linear_proj.weight"));
	struct vps_tensor t;
	CHECK_OK(vps_model_tensor(&m, ln, &t));
	CHECK_EQ(t.ndim, 1);
	CHECK_EQ(t.shape[0], 2048);
	CHECK_EQ(t.split, VPS_SPLIT_NONE);
	/* every layer has one, so the parameters are Hugging Face's 15.7B plus
	 * 27 x 2048: attention 2048 (input norm) + 2048 x 2048 (o) + 2048 +
	 * 3072 x 2048 (q) + 576 x 2048 (kv_a) + 512 + 4096 x 512 (kv_b); the
	 * post-attention norm; one dense MLP 3 x 2048 x 10944; 26 MoE layers of
	 * 66 x 3 x 2048 x 1408 and a gate 64 x 2048; embedding and head
	 * 2 x 102400 x 2048; the final norm */
	int64_t attention = 2048 + 2048LL * 2048 + 2048 + 3072LL * 2048 + 576LL * 2048 + 512 + 4096LL * 512;
	int64_t want = 27 * (attention + 2048) + 3LL * 2048 * 10944 + 26 * (66 * 3LL * 2048 * 1408 + 64 * 2048) +
		       2LL * 102400 * 2048 + 2048;
	CHECK_EQ(vps_model_parameters(&m), want);
	CHECK_EQ(vps_model_parameters(&m) - 27 * 2048, 15706484224LL);
	/* with query compression there is none */
	load(&m, "tiny-deepseek");
	CHECK(vps_model_find_tensor(&m, "decoder.layers.0.self_attention.linear_q_proj.layer_norm_weight", &ln) ==
	      VPS_EINPUT);
}

/* tiny-deepseek by hand. Attention: input_layernorm 64, linear_proj
 * 64 x 4*16, q_down 48 x 64, q_up norm 48, q_up 4*24 x 48, kv_down (32+8)
 * x 64, kv_up norm 32, kv_up 4*(16+16) x 32 = 18,576. Dense MLP: norm 64,
 * fc1 2*128 x 64, fc2 64 x 128 = 24,640. MoE: pre-MLP norm 64, router
 * 8 x 64, 8 experts of 2*32 x 64 + 64 x 32, shared fc1 2*64 x 64 and fc2
 * 64 x 64 = 62,016. Embedding, head 500 x 64 each, final norm 64. The MTP
 * layer: enorm, hnorm, final_layernorm 64 each, eh_proj 64 x 128, and an
 * MoE layer (18,576 + 62,016) = 88,976. */
TEST(tiny_deepseek_counts_by_hand)
{
	struct vps_model m, hf;
	load(&m, "tiny-deepseek");
	CHECK_EQ(vps_model_parameters(&m), 4 * 18576 + 2 * 24640 + 2 * 62016 + 2 * 32000 + 64 + 88976);
	CHECK_EQ(vps_model_parameters(&m), 400656);
	/* the router's expert_bias: fp32 [8] in each of the 3 MoE layers (MTP's included) */
	CHECK_EQ(vps_model_module_buffers(&m), 24);
	CHECK_OK(vps_model_parse(&hf, "tiny/config.json", tiny_config, sizeof(tiny_config) - 1));
	CHECK_EQ(vps_model_hash(&hf), vps_model_hash(&m));
}

/* TransformerLayer registers input_layernorm, then self_attention
 * (MultiLatentAttention builds linear_proj before MLASelfAttention builds
 * q_down, q_up, kv_down, kv_up), then the MLP; MoELayer registers the
 * router, the experts, then shared_experts. */
TEST(registration_order_of_dense_and_moe_layers)
{
	struct vps_model m;
	load(&m, "tiny-deepseek");
	static const char *att[] = {
		"input_layernorm.weight",
		"self_attention.linear_proj.weight",
		"self_attention.linear_q_down_proj.weight",
		"self_attention.linear_q_up_proj.layer_norm_weight",
		"self_attention.linear_q_up_proj.weight",
		"self_attention.linear_kv_down_proj.weight",
		"self_attention.linear_kv_up_proj.layer_norm_weight",
		"self_attention.linear_kv_up_proj.weight",
	};
	static const char *dense_mlp[] = {"mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight",
					  "mlp.linear_fc2.weight"};
	static const char *moe_head[] = {"pre_mlp_layernorm.weight", "mlp.router.weight"};
	static const char *moe_tail[] = {"mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"};
	char want[256], name[256];
	for (int64_t layer = 0; layer < 4; layer++) {
		struct vps_layer_span sp;
		vps_model_layer_span(&m, layer, &sp);
		CHECK_EQ(sp.first, vps_model_layer_first(&m, layer));
		CHECK_EQ(sp.first, 1 + (layer < 2 ? layer * 11 : 22 + (layer - 2) * 28));
		CHECK_EQ(vps_model_layer_moe(&m, layer), layer >= 2);
		CHECK_EQ(sp.count, layer < 2 ? 11 : 8 + 2 + 8 * 2 + 2);
		CHECK_EQ(sp.experts, layer < 2 ? 0 : 8);
		uint32_t id = sp.first;
		struct vps_tensor t;
		for (size_t i = 0; i < 8; i++, id++) {
			snprintf(want, sizeof(want), "decoder.layers.%lld.%s", (long long)layer, att[i]);
			CHECK_OK(vps_model_tensor(&m, id, &t));
			vps_tensor_name(&t, name, sizeof(name));
			CHECK(strcmp(name, want) == 0);
		}
		if (layer < 2) {
			for (size_t i = 0; i < 3; i++, id++) {
				snprintf(want, sizeof(want), "decoder.layers.%lld.%s", (long long)layer, dense_mlp[i]);
				CHECK_OK(vps_model_tensor(&m, id, &t));
				vps_tensor_name(&t, name, sizeof(name));
				CHECK(strcmp(name, want) == 0);
			}
			continue;
		}
		for (size_t i = 0; i < 2; i++, id++) {
			snprintf(want, sizeof(want), "decoder.layers.%lld.%s", (long long)layer, moe_head[i]);
			CHECK_OK(vps_model_tensor(&m, id, &t));
			vps_tensor_name(&t, name, sizeof(name));
			CHECK(strcmp(name, want) == 0);
		}
		CHECK_EQ(id, sp.first + sp.expert_first);
		for (int e = 0; e < 8; e++)
			for (int k = 1; k <= 2; k++, id++) {
				snprintf(want, sizeof(want), "decoder.layers.%lld.mlp.experts.local_experts.%d.linear_fc%d.weight",
					 (long long)layer, e, k);
				CHECK_OK(vps_model_tensor(&m, id, &t));
				vps_tensor_name(&t, name, sizeof(name));
				CHECK(strcmp(name, want) == 0);
				CHECK(t.is_expert);
			}
		for (size_t i = 0; i < 2; i++, id++) {
			snprintf(want, sizeof(want), "decoder.layers.%lld.%s", (long long)layer, moe_tail[i]);
			CHECK_OK(vps_model_tensor(&m, id, &t));
			vps_tensor_name(&t, name, sizeof(name));
			CHECK(strcmp(name, want) == 0);
			CHECK(!t.is_expert);
		}
		CHECK_EQ(id, sp.first + sp.count);
	}
	/* then the MTP layer (MultiTokenPredictionLayer.__init__): enorm, hnorm,
	 * eh_proj, an MoE layer like the last decoder layer, final_layernorm */
	static const char *mtp_names[] = {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight",
					  "mtp.layers.0.eh_proj.weight",
					  "mtp.layers.0.mtp_model_layer.input_layernorm.weight",
					  "mtp.layers.0.mtp_model_layer.self_attention.linear_proj.weight"};
	struct vps_mtp_span ms;
	vps_model_mtp_span(&m, 0, &ms);
	CHECK_EQ(ms.first, 1 + 2 * 11 + 2 * 28 + 2);
	CHECK_EQ(ms.count, 3 + 28 + 1);
	CHECK_EQ(ms.layer.first, ms.first + 3);
	CHECK_EQ(ms.layer.experts, 8);
	for (uint32_t i = 0; i < 5; i++) {
		struct vps_tensor t;
		CHECK_OK(vps_model_tensor(&m, ms.first + i, &t));
		vps_tensor_name(&t, name, sizeof(name));
		CHECK(strcmp(name, mtp_names[i]) == 0);
		CHECK_EQ(t.mtp, 0);
		CHECK_EQ(t.layer, -1);
	}
	struct vps_tensor t;
	CHECK_OK(vps_model_tensor(&m, ms.layer.first + ms.layer.expert_first + 7 * 2 + 1, &t));
	vps_tensor_name(&t, name, sizeof(name));
	CHECK(strcmp(name, "mtp.layers.0.mtp_model_layer.mlp.experts.local_experts.7.linear_fc2.weight") == 0);
	CHECK(t.is_expert);
	CHECK_EQ(t.expert, 7);
	CHECK_OK(vps_model_tensor(&m, ms.first + 2, &t));
	CHECK_EQ(t.shape[0], 64);
	CHECK_EQ(t.shape[1], 128);
	CHECK(t.split == VPS_SPLIT_AXIS && t.axis == 0);
	CHECK_OK(vps_model_tensor(&m, ms.first + ms.count - 1, &t));
	vps_tensor_name(&t, name, sizeof(name));
	CHECK(strcmp(name, "mtp.layers.0.final_layernorm.weight") == 0);
	/* after them the module buffers: layers 2-3's and the MTP layer's router bias */
	CHECK_EQ(vps_model_module_first(&m), 1 + 2 * 11 + 2 * 28 + 2 + (3 + 28 + 1));
	CHECK_EQ(vps_model_num_tensors(&m), 1 + 2 * 11 + 2 * 28 + 2 + (3 + 28 + 1) + 3);
	CHECK_OK(vps_model_tensor(&m, vps_model_module_first(&m) + 2, &t));
	vps_tensor_name(&t, name, sizeof(name));
	CHECK(strcmp(name, "mtp.layers.0.mtp_model_layer.mlp.router.expert_bias") == 0);
	CHECK(t.module_buffer && !t.is_expert && t.mtp == 0 && t.layer == -1);
	CHECK_EQ(t.ndim, 1);
	CHECK_EQ(t.shape[0], 8);
	CHECK_OK(vps_model_tensor(&m, vps_model_module_first(&m), &t));
	vps_tensor_name(&t, name, sizeof(name));
	CHECK(strcmp(name, "decoder.layers.2.mlp.router.expert_bias") == 0);
	CHECK(t.module_buffer && t.layer == 2 && t.split == VPS_SPLIT_NONE);
	/* every name finds its tensor, and a dense layer has no router */
	for (uint32_t id = 0; id < vps_model_num_tensors(&m); id++) {
		uint32_t back = UINT32_MAX;
		CHECK_OK(vps_model_tensor(&m, id, &t));
		vps_tensor_name(&t, name, sizeof(name));
		CHECK_OK(vps_model_find_tensor(&m, name, &back));
		CHECK_EQ(back, id);
	}
	uint32_t none;
	CHECK(vps_model_find_tensor(&m, "decoder.layers.1.mlp.router.weight", &none) == VPS_EINPUT);
	CHECK(vps_model_find_tensor(&m, "decoder.layers.3.mlp.linear_fc1.weight", &none) == VPS_EINPUT);
	CHECK(vps_model_find_tensor(&m, "mtp.layers.1.enorm.weight", &none) == VPS_EINPUT);
	CHECK(vps_model_find_tensor(&m, "mtp.layers.0.mtp_model_layer.eh_proj.weight", &none) == VPS_EINPUT);
	CHECK(vps_model_find_tensor(&m, "mtp.layers.0.mlp.router.weight", &none) == VPS_EINPUT);
	CHECK(vps_model_find_tensor(&m, "decoder.layers.1.mlp.router.expert_bias", &none) == VPS_EINPUT);
	CHECK(vps_model_find_tensor(&m, "mtp.layers.0.mlp.router.expert_bias", &none) == VPS_EINPUT);
	CHECK(!vps_model_router_bias(&m, 1, -1, &none));
	CHECK(!vps_model_router_bias(&m, -1, 1, &none));
}

/* Layer queries are O(1): DeepSeek-V3's last layer and tensor without a
 * per-layer table. 3 dense layers of 12 tensors (input norm, proj, q_down,
 * q_up norm, q_up, kv_down, kv_up norm, kv_up, fc1 norm, fc1, fc2), 58 MoE
 * layers of 8 + 2 + 512 + 2. */
TEST(deepseek_v3_layer_spans)
{
	struct vps_model m;
	load(&m, "deepseek-v3");
	CHECK_EQ(vps_model_layer_first(&m, 3), 1 + 3 * 11);
	CHECK_EQ(vps_model_layer_first(&m, 61), 1 + 3 * 11 + 58 * 524);
	CHECK_EQ(vps_model_num_tensors(&m), 1 + 3 * 11 + 58 * 524 + 2 + (3 + 524 + 1) + 59);
	struct vps_mtp_span ms;
	vps_model_mtp_span(&m, 0, &ms);
	CHECK_EQ(ms.first, 1 + 3 * 11 + 58 * 524 + 2);
	CHECK_EQ(ms.layer.experts, 256);
	struct vps_tensor t;
	CHECK_OK(vps_model_tensor(&m, ms.first + 2, &t));
	CHECK(t.kind == VPS_T_MTP_EH_PROJ_W);
	CHECK_EQ(t.shape[0], 7168);
	CHECK_EQ(t.shape[1], 14336);
	CHECK_OK(vps_model_tensor(&m, 1 + 3 * 11 + 57 * 524 + 10 + 255 * 2 + 1, &t));
	CHECK_EQ(t.layer, 60);
	CHECK_EQ(t.expert, 255);
	CHECK(t.kind == VPS_T_EXP_FC2_W);
	CHECK_EQ(t.shape[0], 7168);
	CHECK_EQ(t.shape[1], 2048);
}

/* The old hash of a model without the new fields: vps_model_hash as it
 * was before them, so every older layout and plan keeps its identity. */
TEST(older_models_keep_their_hash)
{
	static const char *names[] = {"tiny-llama", "tiny-gpt", "tiny-qwen3-moe", "qwen3-235b-a22b"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		struct vps_model m;
		load(&m, names[i]);
		int64_t f[] = {m.hidden, m.layers, m.heads, m.query_groups, m.head_dim, m.ffn,
			       m.vocab, m.vocab_divisor, m.norm, m.activation, m.position,
			       m.max_positions, m.bias, m.qkv_bias, m.tied_embeddings, m.qk_norm,
			       m.experts, m.moe_ffn};
		CHECK_EQ(vps_model_hash(&m), vps_hash64(f, sizeof(f), 0x6d6f64656cULL));
	}
	struct vps_model a, b;
	load(&a, "tiny-deepseek");
	b = a;
	b.first_dense = 1;
	CHECK(vps_model_hash(&a) != vps_model_hash(&b));
}

static const struct vps_region *region_of(const struct vps_rank_view *v, uint32_t tensor, int state)
{
	for (size_t i = 0; i < v->nregions; i++)
		if (v->regions[i].tensor == tensor && v->regions[i].state == state)
			return &v->regions[i];
	return NULL;
}

static const struct vps_param *param_of(const struct vps_rank_view *v, uint32_t tensor)
{
	for (size_t i = 0; i < v->nparams; i++)
		if (v->params[i].tensor == tensor && !v->params[i].output_copy)
			return &v->params[i];
	return NULL;
}

/* MLA at tp 2: the up projections are column parallel, viewed per head
 * ([tokens, heads_per_partition, q_head_dim]), so rank 1 holds heads 2-3:
 * of linear_q_up_proj [4, 24, 48] 2 x 24 x 48 = 2,304 elements; the
 * 'duplicated' down projections are whole on both ranks; linear_proj is
 * row parallel over its 4 x 16 inputs. */
TEST(mla_tp_split_by_hand)
{
	struct vps_layout *l = test_layout("tiny-deepseek", "tp=2,pp=1,dp=1", 8, 0);
	if (!l)
		return;
	const struct vps_model *m = vps_layout_model(l);
	uint32_t qup = tensor_id(m, "decoder.layers.0.self_attention.linear_q_up_proj.weight");
	uint32_t kvup = tensor_id(m, "decoder.layers.3.self_attention.linear_kv_up_proj.weight");
	uint32_t qdown = tensor_id(m, "decoder.layers.0.self_attention.linear_q_down_proj.weight");
	uint32_t kvdown = tensor_id(m, "decoder.layers.3.self_attention.linear_kv_down_proj.weight");
	uint32_t proj = tensor_id(m, "decoder.layers.2.self_attention.linear_proj.weight");
	for (int64_t rank = 0; rank < 2; rank++) {
		struct vps_rank_view v;
		CHECK_OK(vps_layout_rank(l, rank, &v));
		const struct vps_region *r = region_of(&v, qup, VPS_STATE_PARAM);
		CHECK(r != NULL);
		if (r) {
			CHECK_EQ(r->box.lo[0], 2 * rank);
			CHECK_EQ(r->box.hi[0], 2 * rank + 2);
			CHECK_EQ(r->box.hi[1], 24);
			CHECK_EQ(r->box.hi[2], 48);
		}
		CHECK_EQ(param_of(&v, qup)->elements, 2 * 24 * 48);
		r = region_of(&v, kvup, VPS_STATE_PARAM);
		CHECK(r != NULL);
		if (r) {
			CHECK_EQ(r->box.lo[0], 2 * rank);
			CHECK_EQ(r->box.hi[1], 32);
			CHECK_EQ(r->box.hi[2], 32);
		}
		CHECK_EQ(param_of(&v, qdown)->elements, 48 * 64);
		CHECK_EQ(param_of(&v, kvdown)->elements, 40 * 64);
		r = region_of(&v, proj, VPS_STATE_PARAM);
		CHECK(r != NULL);
		if (r) {
			CHECK_EQ(r->box.lo[0], 0);
			CHECK_EQ(r->box.hi[0], 64);
			CHECK_EQ(r->box.lo[1], 32 * rank);
			CHECK_EQ(r->box.hi[1], 32 * rank + 32);
		}
		vps_rank_view_release(&v);
	}
	vps_layout_free(l);
}

/* MTP at tp 2, pp 2, ep 2, etp 1, with the distributed optimizer.
 * GPTModel builds an embedding on the MTP stage (mtp_process) before the
 * decoder; language_module.py marks it and stage 0's embedding
 * shared_embedding, so each is a bucket of its own; the MTP block follows
 * decoder.final_layernorm and precedes output_layer (gpt_model.py).
 * Rank 2 (stage 1, tp 0): the embedding copy holds padded vocabulary rows
 * [0, 256) of 512 (500 rounded up to 128 x tp), 256 x 64 elements;
 * eh_proj [64, 128] is column parallel, rows [0, 32): 4,096 elements; the
 * MTP layer's experts 0-3 are its EP rank's, in the expert buffer. */
TEST(mtp_on_the_last_stage_by_hand)
{
	struct vps_layout *l = test_layout("tiny-deepseek", "tp=2,pp=2,dp=1,ep=2,etp=1,zero=1", 8, 0);
	if (!l)
		return;
	const struct vps_model *m = vps_layout_model(l);
	uint32_t eh = tensor_id(m, "mtp.layers.0.eh_proj.weight");
	uint32_t fin = tensor_id(m, "mtp.layers.0.final_layernorm.weight");
	uint32_t out = tensor_id(m, "output_layer.weight");
	uint32_t dfin = tensor_id(m, "decoder.final_layernorm.weight");
	struct vps_rank_view v;
	char name[256];
	CHECK_OK(vps_layout_rank(l, 2, &v));
	CHECK(v.nparams > 4);
	const struct vps_param *p = &v.params[0];
	CHECK(p->output_copy && p->tensor == 0);
	CHECK_EQ(p->elements, 256 * 64);
	vps_layout_param_name(l, p, name, sizeof(name));
	CHECK(strcmp(name, "embedding.word_embeddings.weight") == 0);
	/* the copy is alone in its bucket */
	for (size_t i = 1; i < v.nparams; i++)
		if (!v.params[i].expert)
			CHECK(v.params[i].bucket != p->bucket);
	/* registration order: decoder.final_layernorm, MTP, output_layer last */
	size_t last_dense = 0, at_dfin = 0, at_eh = 0, at_fin = 0;
	for (size_t i = 0; i < v.nparams; i++) {
		struct vps_tensor t;
		CHECK_OK(vps_model_tensor(m, v.params[i].tensor, &t));
		if (v.params[i].expert || t.module_buffer)
			continue;
		last_dense = i;
		if (v.params[i].tensor == dfin)
			at_dfin = i;
		if (v.params[i].tensor == eh)
			at_eh = i;
		if (v.params[i].tensor == fin)
			at_fin = i;
	}
	CHECK_EQ(v.params[last_dense].tensor, out);
	CHECK(at_dfin > 0 && at_dfin < at_eh && at_eh < at_fin && at_fin < last_dense);
	CHECK_EQ(v.params[at_eh].elements, 32 * 128);
	const struct vps_region *r = region_of(&v, eh, VPS_STATE_PARAM);
	CHECK(r != NULL);
	if (r) {
		CHECK_EQ(r->box.lo[0], 0);
		CHECK_EQ(r->box.hi[0], 32);
		CHECK_EQ(r->box.hi[1], 128);
	}
	r = region_of(&v, 0, VPS_STATE_PARAM);
	CHECK(r != NULL);
	if (r) {
		CHECK_EQ(r->box.lo[0], 0);
		CHECK_EQ(r->box.hi[0], 256);
	}
	/* the MTP layer's routed experts: local 0-3 are global 0-3 on ep rank 0 */
	int mtp_experts = 0;
	for (size_t i = 0; i < v.nparams; i++) {
		if (!v.params[i].expert)
			continue;
		struct vps_tensor t;
		CHECK_OK(vps_model_tensor(m, v.params[i].tensor, &t));
		if (t.mtp != 0)
			continue;
		mtp_experts++;
		CHECK(t.expert >= 0 && t.expert < 4);
		CHECK_EQ(v.params[i].local_expert, t.expert);
	}
	CHECK_EQ(mtp_experts, 4 * 2);
	vps_rank_view_release(&v);
	/* stage 0's embedding is shared_embedding too: a bucket of its own */
	CHECK_OK(vps_layout_rank(l, 0, &v));
	CHECK(v.params[0].tensor == 0 && !v.params[0].output_copy);
	for (size_t i = 1; i < v.nparams; i++)
		if (!v.params[i].expert)
			CHECK(v.params[i].bucket != v.params[0].bucket);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* Shared experts at tp 2, ep 2, etp 1: SharedExpertMLP is a dense MLP
 * (is_expert false), split over TP with the gated [gate; up] layout of
 * fc1, in the dense buffer; the routed experts are whole (etp 1) in the
 * expert buffer of their EP rank. */
TEST(shared_experts_are_dense_and_tp_split)
{
	struct vps_layout *l = test_layout("tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1", 8, 0);
	if (!l)
		return;
	const struct vps_model *m = vps_layout_model(l);
	uint32_t sfc1 = tensor_id(m, "decoder.layers.3.mlp.shared_experts.linear_fc1.weight");
	uint32_t sfc2 = tensor_id(m, "decoder.layers.3.mlp.shared_experts.linear_fc2.weight");
	uint32_t e5 = tensor_id(m, "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight");
	uint32_t fc1 = tensor_id(m, "decoder.layers.1.mlp.linear_fc1.weight");
	/* rank 5 = tp 1 + 2 * (dp 0 + 2 * pp 1); expert rank: ep 1 */
	struct vps_rank_view v;
	CHECK_OK(vps_layout_rank(l, 5, &v));
	const struct vps_param *p = param_of(&v, sfc1);
	CHECK(p != NULL);
	if (p) {
		CHECK(!p->expert);
		CHECK_EQ(p->elements, 2 * 32 * 64);
	}
	const struct vps_region *r = region_of(&v, sfc1, VPS_STATE_PARAM);
	CHECK(r != NULL);
	if (r) {
		CHECK_EQ(r->box.lo[0], 0);
		CHECK_EQ(r->box.hi[0], 2);
		CHECK_EQ(r->box.lo[1], 32);
		CHECK_EQ(r->box.hi[1], 64);
	}
	p = param_of(&v, sfc2);
	CHECK(p != NULL);
	if (p)
		CHECK_EQ(p->elements, 64 * 32);
	p = param_of(&v, e5);
	CHECK(p != NULL);
	if (p) {
		CHECK(p->expert);
		CHECK_EQ(p->local_expert, 1);
		CHECK_EQ(p->elements, 2 * 32 * 64);
	}
	/* stage 1 holds the MoE layers only: no dense MLP */
	CHECK(param_of(&v, fc1) == NULL);
	vps_rank_view_release(&v);
	/* stage 0 holds the dense layers, and no expert buffer */
	CHECK_OK(vps_layout_rank(l, 1, &v));
	CHECK(param_of(&v, fc1) != NULL);
	for (size_t i = 0; i < v.nparams; i++)
		CHECK(!v.params[i].expert);
	vps_rank_view_release(&v);
	vps_layout_free(l);
}

/* The router's expert_bias (TopKRouter: register_buffer, fp32 [experts])
 * at tp 2, pp 2, dp 2, ep 2 with the distributed optimizer. Stage 1
 * (ranks 4-7) holds MoE layers 2-3 and the MTP layer; every one of its
 * ranks updates the bias from counts all-reduced over TP x CP x DP
 * (_update_router_expert_bias), so each holds it whole: one fp32 buffer of
 * group module after the chunk's dense and expert buffers (4 states each),
 * buffer 8, 3 x 8 elements, layers 2, 3, then MTP; no ZeRO shard, no
 * optimizer state. Stage 0's layers are dense: no module buffer. */
TEST(router_bias_is_a_module_buffer_by_hand)
{
	struct vps_layout *l = test_layout("tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,zero=1", 8, 0);
	if (!l)
		return;
	const struct vps_model *m = vps_layout_model(l);
	uint32_t b2 = tensor_id(m, "decoder.layers.2.mlp.router.expert_bias");
	uint32_t b3 = tensor_id(m, "decoder.layers.3.mlp.router.expert_bias");
	uint32_t bm = tensor_id(m, "mtp.layers.0.mtp_model_layer.mlp.router.expert_bias");
	CHECK(vps_layout_has_state(l, VPS_STATE_MODULE));
	CHECK(!vps_layout_has_state(l, VPS_STATE_GRAD));
	for (int64_t rank = 4; rank < 8; rank++) {
		struct vps_rank_view v;
		CHECK_OK(vps_layout_rank(l, rank, &v));
		CHECK_EQ(v.nbuffers, 9);
		const struct vps_buffer *b = &v.buffers[8];
		CHECK(b->state == VPS_STATE_MODULE && b->dtype == VPS_DTYPE_FP32 && !b->sharded && !b->expert);
		CHECK_EQ(b->elements, 24);
		CHECK_EQ(vps_layout_buffer_elements(l, rank, 8), 24);
		uint32_t ids[] = {b2, b3, bm};
		for (int k = 0; k < 3; k++) {
			const struct vps_region *r = region_of(&v, ids[k], VPS_STATE_MODULE);
			CHECK(r != NULL);
			if (r) {
				CHECK_EQ(r->buffer, 8);
				CHECK_EQ(r->offset, 8 * k);
				CHECK_EQ(r->box.lo[0], 0);
				CHECK_EQ(r->box.hi[0], 8);
			}
			CHECK(region_of(&v, ids[k], VPS_STATE_PARAM) == NULL);
			CHECK(region_of(&v, ids[k], VPS_STATE_EXP_AVG) == NULL);
		}
		char name[256];
		vps_layout_param_name(l, param_of(&v, b3), name, sizeof(name));
		CHECK(strcmp(name, "decoder.layers.1.mlp.router.expert_bias") == 0);
		vps_rank_view_release(&v);
	}
	struct vps_rank_view v0;
	CHECK_OK(vps_layout_rank(l, 0, &v0));
	for (size_t i = 0; i < v0.nbuffers; i++)
		CHECK(v0.buffers[i].state != VPS_STATE_MODULE);
	vps_rank_view_release(&v0);
	CHECK_EQ(test_holder_set(l, b3, VPS_STATE_MODULE), 0xf0);
	CHECK_EQ(test_holder_set(l, b3, VPS_STATE_PARAM), 0);
	CHECK_EQ(test_holder_set(l, tensor_id(m, "decoder.layers.3.mlp.router.weight"), VPS_STATE_MODULE), 0);
	struct vps_layout_stats st;
	CHECK_OK(vps_layout_stats(l, &st));
	CHECK_EQ(st.logical_bytes, 400656 * (2 + 3 * 4) + 24 * 4);
	vps_layout_free(l);
	/* a model without router_bias holds no such state */
	l = test_layout("qwen3-30b-a3b", "tp=4,ep=8,etp=1,dp=2", 8, 0);
	if (l) {
		CHECK(!vps_layout_has_state(l, VPS_STATE_MODULE));
		vps_layout_free(l);
	}
}

/* Every element of every state in exactly one place per replica, for
 * layouts that cut dense and MoE layers differently. */
TEST(deepseek_layouts_verify)
{
	static const char *cases[][2] = {
		{"tiny-deepseek", "tp=2,pp=2,dp=2,ep=2,etp=1,zero=1"},
		{"tiny-deepseek", "tp=2,pp=2,dp=1,ep=2,etp=1,zero=1"},
		{"tiny-deepseek", "tp=4,pp=1,dp=2,ep=8,etp=1,zero=1"},
		{"tiny-deepseek", "tp=2,pp=3,dp=1,first=1,last=1,zero=1"},
		{"tiny-deepseek", "tp=1,pp=2,dp=4,vpp=2,ep=4,zero=1"},
		{"tiny-deepseek", "tp=2,cp=2,pp=2,dp=1,ep=2,etp=1,zero=1"},
		{"deepseek-v3", "tp=8,pp=16,dp=2,ep=16,etp=1,first=3,last=2,zero=1"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vps_layout *l = test_layout(cases[i][0], cases[i][1], 8, 0);
		if (!l)
			continue;
		struct vps_verify_report rep;
		CHECK_OK(vps_verify_layout(l, &rep));
		if (rep.violations)
			harness_fail(__FILE__, __LINE__, "%s %s: %lld violations", cases[i][0], cases[i][1],
				     (long long)rep.violations);
		vps_verify_report_release(&rep);
		vps_layout_free(l);
	}
}

/* Plans between tiny-deepseek layouts move every element right (applied
 * in memory, every element checked) and nothing resident moves. */
TEST(deepseek_plans_move_every_element_right)
{
	static const char *cases[][2] = {
		{"tp=2,pp=2,dp=2,ep=2,etp=1,zero=1", "tp=4,pp=1,dp=2,ep=8,etp=1,zero=1"},
		{"tp=4,pp=1,dp=2,ep=8,etp=1,zero=1", "tp=1,pp=2,dp=4,vpp=2,ep=4,zero=1"},
		{"tp=2,pp=3,dp=1,first=1,last=1,zero=1", "tp=2,pp=2,dp=2,ep=2,etp=2,zero=1"},
		{"tp=2,cp=2,pp=2,dp=1,ep=2,etp=1,zero=1", "tp=1,pp=4,dp=2,ep=2,zero=1"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vps_layout *a = test_layout("tiny-deepseek", cases[i][0], 8, 0);
		struct vps_layout *b = test_layout("tiny-deepseek", cases[i][1], 8, 0);
		if (!a || !b)
			continue;
		struct vps_plan_opts o = VPS_PLAN_OPTS_INIT;
		struct vps_plan *p = NULL;
		CHECK_OK(vps_plan_compute(&p, a, b, &o));
		if (!p)
			continue;
		char what[256];
		snprintf(what, sizeof(what), "%s -> %s", cases[i][0], cases[i][1]);
		job_plan_exact(p, what);
		vps_plan_free(p);
	}
}

static vps_result_t parse_yaml(struct vps_model *m, const char *text)
{
	return vps_model_parse(m, "m.yaml", text, strlen(text));
}

#define BASE                                                                              \
	"vps: model\nversion: 1\nname: t\nhidden: 64\nlayers: 4\nheads: 4\nvocab: 500\n"

TEST(bad_deepseek_models_are_refused)
{
	struct vps_model m;
	/* dense first layers need an MoE model, and leave one MoE layer */
	CHECK(parse_yaml(&m, BASE "ffn: 128\nfirst_dense: 1\n") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "line 9") != NULL);
	CHECK(parse_yaml(&m, BASE "ffn: 128\nexperts: 4\nmoe_ffn: 32\nfirst_dense: 4\n") == VPS_EINPUT);
	CHECK(parse_yaml(&m, BASE "experts: 4\nmoe_ffn: 32\nfirst_dense: 2\n") == VPS_EINPUT);
	CHECK(parse_yaml(&m, BASE "ffn: 128\nshared_ffn: 64\n") == VPS_EINPUT);
	CHECK(parse_yaml(&m, BASE "ffn: 128\nrouter_bias: true\n") == VPS_EINPUT);
	/* MLA fields without kv_lora_rank, and MLA without its head sizes */
	CHECK(parse_yaml(&m, BASE "ffn: 128\nq_lora_rank: 32\n") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "kv_lora_rank") != NULL);
	CHECK(parse_yaml(&m, BASE "ffn: 128\nkv_lora_rank: 32\n") == VPS_EINPUT);
	CHECK(parse_yaml(&m, BASE "ffn: 128\nhead_dim: 24\nkv_lora_rank: 32\nqk_head_dim: 16\nqk_pos_dim: 8\n"
				  "v_head_dim: 16\nbias: true\n") == VPS_EINPUT);
	CHECK(parse_yaml(&m, BASE "ffn: 128\nkv_lora_rank: 32\nqk_head_dim: 16\nqk_pos_dim: 8\nv_head_dim: 16\n") ==
	      VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "head_dim") != NULL);
	CHECK_OK(parse_yaml(&m, BASE "ffn: 128\nhead_dim: 24\nkv_lora_rank: 32\nqk_head_dim: 16\nqk_pos_dim: 8\n"
				    "v_head_dim: 16\n"));
	/* no query compression: linear_q_proj [heads, 24, hidden] */
	uint32_t id = tensor_id(&m, "decoder.layers.0.self_attention.linear_q_proj.weight");
	struct vps_tensor t;
	CHECK_OK(vps_model_tensor(&m, id, &t));
	CHECK_EQ(t.shape[0] * t.shape[1] * t.shape[2], 4 * 24 * 64);
	/* Hugging Face: MoE every other layer is not supported */
	char cfg[sizeof(tiny_config) + 64];
	snprintf(cfg, sizeof(cfg), "%s", tiny_config);
	char *f = strstr(cfg, "\"moe_layer_freq\": 1");
	CHECK(f != NULL);
	if (f)
		f[strlen("\"moe_layer_freq\": ")] = '2';
	CHECK(vps_model_parse(&m, "c/config.json", cfg, strlen(cfg)) == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "moe_layer_freq") != NULL);
	/* and an MTP depth beyond any model's, named by its Hugging Face key */
	snprintf(cfg, sizeof(cfg), "%s", tiny_config);
	f = strstr(cfg, "\"num_nextn_predict_layers\": 1");
	CHECK(f != NULL);
	if (f)
		memcpy(f + strlen("\"num_nextn_predict_layers\": "), "9", 1);
	CHECK(vps_model_parse(&m, "c/config.json", cfg, strlen(cfg)) == VPS_OK);
	CHECK_EQ(m.mtp_layers, 9);
	if (f)
		memcpy(f + strlen("\"num_nextn_predict_layers\": "), "0", 1);
	CHECK(vps_model_parse(&m, "c/config.json", cfg, strlen(cfg)) == VPS_OK);
	CHECK_EQ(m.mtp_layers, 0);
	/* MTP: a handful of layers; a dense model's repeat its dense layer */
	CHECK(parse_yaml(&m, BASE "ffn: 128\nmtp_layers: 65\n") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "mtp_layers") != NULL);
	CHECK_OK(parse_yaml(&m, BASE "ffn: 128\nmtp_layers: 2\n"));
	id = tensor_id(&m, "mtp.layers.1.mtp_model_layer.mlp.linear_fc1.weight");
	CHECK_OK(vps_model_tensor(&m, id, &t));
	CHECK_EQ(t.mtp, 1);
	CHECK(t.kind == VPS_T_FC1_W);
	CHECK_EQ(id, vps_model_num_tensors(&m) - 3);
	/* tied embeddings and MTP on another stage: two copies Megatron does
	 * not tie; refused rather than guessed */
	CHECK_OK(parse_yaml(&m, BASE "ffn: 128\nmtp_layers: 1\ntied_embeddings: true\n"));
	struct vps_parallel par;
	vps_parallel_init(&par);
	CHECK_OK(vps_parallel_parse(&par, "tp=1,pp=2,dp=1", "p"));
	CHECK(vps_parallel_validate(&par, &m, "p") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "tied") != NULL);
	par.pp = 1;
	CHECK_OK(vps_parallel_validate(&par, &m, "p"));
	/* Megatron-LM's validate_args: MTP needs rope (or no) positions */
	CHECK(parse_yaml(&m, BASE "ffn: 128\nposition: learned\nmax_positions: 64\nmtp_layers: 1\n") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "multi-token prediction (mtp_layers=1) needs rope positions") != NULL);
	CHECK_OK(parse_yaml(&m, BASE "ffn: 128\nposition: learned\nmax_positions: 64\n"));
}

/* TP must divide the dense first layers' and the shared experts' MLPs
 * (ColumnParallelLinear divides output_size by the TP size): refused, not
 * cut unevenly. */
TEST(tp_must_divide_dense_and_shared_mlps)
{
	struct vps_model m;
	CHECK_OK(parse_yaml(&m, BASE "ffn: 98\nhead_dim: 24\nexperts: 4\nmoe_ffn: 32\nfirst_dense: 1\n"
				    "shared_ffn: 48\nkv_lora_rank: 32\nqk_head_dim: 16\nqk_pos_dim: 8\nv_head_dim: 16\n"));
	struct vps_parallel p;
	vps_parallel_init(&p);
	p.tp = 4;
	p.etp = 1;
	CHECK(vps_parallel_validate(&p, &m, "x") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "ffn=98") != NULL);
	p.tp = 2;
	CHECK_OK(vps_parallel_validate(&p, &m, "x"));
	m.shared_ffn = 49;
	CHECK(vps_parallel_validate(&p, &m, "x") == VPS_EINPUT);
	CHECK(strstr(vps_last_error(), "shared_ffn") != NULL);
}
