/* Models and their global Virtual Parameter Space.
 *
 * A model is a transformer described by a few integers and switches. Its
 * global VPS is the list of logical tensors in Megatron-Core's registration
 * order, each named as Megatron names it (with the global layer and expert
 * index), with a logical shape in which every parallel split is an
 * axis-aligned box. The list is computed, not stored: tensor i of a model
 * with a quarter of a million experts costs the same as tensor i of a small
 * one. */
#ifndef VPS_MODEL_H
#define VPS_MODEL_H

#include "vps/box.h"

#ifdef __cplusplus
extern "C" {
#endif

enum vps_norm { VPS_NORM_RMS = 0, VPS_NORM_LAYER = 1 };
enum vps_activation { VPS_ACT_SWIGLU = 0, VPS_ACT_GELU = 1 };
enum vps_position { VPS_POS_ROPE = 0, VPS_POS_LEARNED = 1 };

struct vps_model {
	char name[64];
	int64_t hidden;
	int64_t layers;
	int64_t heads;
	int64_t query_groups;   /* key/value heads; == heads without GQA */
	int64_t head_dim;       /* kv_channels */
	int64_t ffn;            /* dense MLP hidden size */
	int64_t vocab;          /* logical, unpadded */
	int64_t vocab_divisor;  /* make_vocab_size_divisible_by (128) */
	enum vps_norm norm;
	enum vps_activation activation;
	enum vps_position position;
	int64_t max_positions;  /* learned position embeddings only */
	bool bias;              /* biases on every linear layer (GPT) */
	bool qkv_bias;          /* a bias on linear_qkv only (Qwen2) */
	bool tied_embeddings;
	bool qk_norm;           /* q_layernorm / k_layernorm (Qwen3) */
	int64_t experts;        /* 0: dense; otherwise layers [first_dense, layers) are MoE */
	int64_t moe_ffn;        /* expert MLP hidden size */
	/* DeepSeek-V2/V3. 0 leaves each off, and an older model unchanged. */
	int64_t first_dense;    /* first_k_dense_replace: layers [0, k) dense with ffn */
	int64_t shared_ffn;     /* moe_shared_expert_intermediate_size (all shared experts) */
	bool router_bias;       /* moe_router_enable_expert_bias: a module buffer per MoE layer */
	int64_t kv_lora_rank;   /* > 0: multi-latent attention (MLA) in place of linear_qkv */
	int64_t q_lora_rank;    /* MLA query compression; 0: linear_q_proj */
	int64_t qk_head_dim;    /* MLA qk_nope_head_dim */
	int64_t qk_pos_dim;     /* MLA qk_rope_head_dim */
	int64_t v_head_dim;     /* MLA */
	int64_t mtp_layers;     /* multi-token prediction depth (--mtp-num-layers), on the last stage */
};

/* What a tensor is, in registration order within a layer. */
enum vps_tensor_kind {
	VPS_T_WORD_EMB,
	VPS_T_POS_EMB,
	VPS_T_PROJ_W,
	VPS_T_PROJ_B,
	VPS_T_QKV_LN_W,
	VPS_T_QKV_LN_B,
	VPS_T_QKV_W,
	VPS_T_QKV_B,
	VPS_T_Q_NORM_W,
	VPS_T_Q_NORM_B,
	VPS_T_K_NORM_W,
	VPS_T_K_NORM_B,
	VPS_T_PRE_MLP_LN_W,
	VPS_T_PRE_MLP_LN_B,
	VPS_T_FC1_LN_W,
	VPS_T_FC1_LN_B,
	VPS_T_FC1_W,
	VPS_T_FC1_B,
	VPS_T_FC2_W,
	VPS_T_FC2_B,
	VPS_T_ROUTER_W,
	VPS_T_EXP_FC1_W,
	VPS_T_EXP_FC1_B,
	VPS_T_EXP_FC2_W,
	VPS_T_EXP_FC2_B,
	VPS_T_FINAL_LN_W,
	VPS_T_FINAL_LN_B,
	VPS_T_OUTPUT_W,
	VPS_T_INPUT_LN_W,   /* input_layernorm: a norm of its own before MLA */
	VPS_T_Q_PROJ_W,     /* MLA without query compression */
	VPS_T_Q_DOWN_W,
	VPS_T_Q_UP_LN_W,
	VPS_T_Q_UP_W,
	VPS_T_KV_DOWN_W,
	VPS_T_KV_UP_LN_W,
	VPS_T_KV_UP_W,
	VPS_T_SHARED_FC1_W, /* shared experts: dense, TP-split, after the routed ones */
	VPS_T_SHARED_FC2_W,
	VPS_T_MTP_ENORM_W,  /* multi-token prediction: mtp.layers.K.enorm */
	VPS_T_MTP_ENORM_B,
	VPS_T_MTP_HNORM_W,
	VPS_T_MTP_HNORM_B,
	VPS_T_MTP_EH_PROJ_W, /* [h, 2h], column parallel */
	VPS_T_MTP_FINAL_LN_W,
	VPS_T_MTP_FINAL_LN_B,
	VPS_T_ROUTER_BIAS,   /* the router's expert_bias: a module buffer, fp32 [experts] */
	VPS_T_Q_PROJ_LN_W,   /* MLA without query compression, with qk_norm: the norm
			      * fused into linear_q_proj (of the hidden state, [h]) */
	VPS_T_NKINDS
};

/* How tensor parallelism cuts a tensor. */
enum vps_split {
	VPS_SPLIT_NONE,  /* replicated on every TP rank */
	VPS_SPLIT_AXIS,  /* axis `axis` cut in TP equal parts (one box per rank) */
	VPS_SPLIT_FLAT,  /* the row-major order cut in TP equal ranges: the
			  * interleaved QKV rows of ColumnParallelLinear */
	VPS_SPLIT_VOCAB, /* axis 0 padded to a multiple of divisor*TP, then cut */
};

struct vps_tensor {
	uint32_t id;
	enum vps_tensor_kind kind;
	int32_t layer;   /* global layer, or -1 */
	int32_t expert;  /* global expert, or -1 */
	int ndim;
	int64_t shape[VPS_MAX_DIMS];
	enum vps_split split;
	int axis;        /* for VPS_SPLIT_AXIS */
	bool is_expert;  /* an expert weight (expert parallel, expert TP) */
	int32_t mtp;     /* multi-token prediction layer (layer is then -1), or -1 */
	bool module_buffer; /* a module's register_buffer, not a Parameter: in no
			     * DDP buffer and no optimizer, one fp32 state */
};

/* Parse a model document (`vps: model`) or a Hugging Face config.json.
 * name is used in messages. */
VPS_API vps_result_t vps_model_parse(struct vps_model *m, const char *name, const void *data, size_t len);

/* Load a model by path (contains '/' or ends in .yaml/.yml/.json) or by name,
 * looked up as NAME.yaml in each directory of the colon-separated
 * search_path. VPS_ENOTFOUND when no model has that name, or a directory
 * named has no config.json. */
VPS_API vps_result_t vps_model_load(struct vps_model *m, const char *spec, const char *search_path);

/* Check the model's own consistency (positive sizes, heads divisible by
 * query groups, ...). */
VPS_API vps_result_t vps_model_validate(const struct vps_model *m, const char *where);

/* @return the number of logical tensors in the global VPS. */
VPS_API uint32_t vps_model_num_tensors(const struct vps_model *m);
/* Describe tensor id. @return VPS_EINPUT when id is out of range. */
VPS_API vps_result_t vps_model_tensor(const struct vps_model *m, uint32_t id, struct vps_tensor *t);
/* Write the tensor's Megatron-Core name (global layer and expert index).
 * @return the length of the full name. */
VPS_API size_t vps_tensor_name(const struct vps_tensor *t, char *buf, size_t n);
/* The name Megatron gives the tensor inside one model chunk, with the
 * chunk-local layer and rank-local expert index. */
VPS_API size_t vps_tensor_local_name(const struct vps_tensor *t, int64_t layer, int64_t expert, char *buf, size_t n);
/* Find a tensor by name. @return VPS_EINPUT when there is none. */
VPS_API vps_result_t vps_model_find_tensor(const struct vps_model *m, const char *name, uint32_t *id);
/* The tensors of one layer, in registration order: ids [first, first +
 * count). Layers differ (dense first layers of an MoE model), so each is
 * asked for; every answer is O(1), whatever the number of layers. In an MoE
 * layer the routed experts are a run inside it: expert e's tensors are ids
 * first + expert_first + e * per_expert + k, k < per_expert; after the run
 * come the shared experts. A dense layer has experts = 0. */
struct vps_layer_span {
	uint32_t first, count;
	uint32_t expert_first, experts, per_expert;
};
VPS_API void vps_model_layer_span(const struct vps_model *m, int64_t layer, struct vps_layer_span *s);
/* Multi-token prediction layer k < mtp_layers: ids [first, first + count)
 * are its enorm, hnorm and eh_proj (`pre` tensors), then a decoder layer of
 * the last decoder layer's kind (`layer`, ids absolute), then its
 * final_layernorm. All of them sit on the last stage's last chunk. */
struct vps_mtp_span {
	uint32_t first, count, pre;
	struct vps_layer_span layer;
};
VPS_API void vps_model_mtp_span(const struct vps_model *m, int64_t k, struct vps_mtp_span *s);
/* Id of the first tensor of a layer. */
VPS_API uint32_t vps_model_layer_first(const struct vps_model *m, int64_t layer);
/* Whether a layer is an MoE layer. */
VPS_API bool vps_model_layer_moe(const struct vps_model *m, int64_t layer);
/* Number of tensors before the first layer. */
VPS_API uint32_t vps_model_pre_tensors(const struct vps_model *m);

/* Logical, unpadded element count of all parameter tensors. */
VPS_API int64_t vps_model_parameters(const struct vps_model *m);
/* Elements of module buffers that are state but not parameters: the
 * router's expert_bias (fp32 [experts] per MoE layer, register_buffer in
 * Megatron's TopKRouter). They are in no DDP buffer and no optimizer;
 * Hugging Face counts them as parameters (e_score_correction_bias). */
VPS_API int64_t vps_model_module_buffers(const struct vps_model *m);
/* Module buffers are tensors too, with ids after every parameter's (so a
 * model without them keeps its ids): ids [vps_model_module_first(m),
 * vps_model_num_tensors(m)). */
VPS_API uint32_t vps_model_module_first(const struct vps_model *m);
/* The module buffer tensor of a decoder layer (layer >= 0) or of MTP layer
 * mtp (layer < 0). @return false when that layer has none. */
VPS_API bool vps_model_router_bias(const struct vps_model *m, int64_t layer, int64_t mtp, uint32_t *id);

/* Hash of the model's definition (name excluded). */
VPS_API uint64_t vps_model_hash(const struct vps_model *m);

#ifdef __cplusplus
}
#endif

#endif
