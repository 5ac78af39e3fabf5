/* Layouts: a parallel configuration applied to a model on a set of devices.
 *
 * A layout answers two questions without ever enumerating all ranks:
 *   - vps_layout_rank(): what does rank R hold (its buffers and regions)?
 *   - vps_layout_holders(): which ranks hold a part of a box of a tensor?
 * Both are computed from Megatron-LM's rules (rank order tp-cp-ep-dp-pp,
 * tensor-parallel splits, pipeline and virtual pipeline placement, expert
 * placement, the distributed optimizer's buffer order, padding and
 * buckets). A layout file may also list ranks explicitly (a rank view read
 * from a file, or registered by a trainer): those ranks hold exactly what
 * is listed. */
#ifndef VPS_LAYOUT_H
#define VPS_LAYOUT_H

#include "vps/parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

enum vps_state {
	VPS_STATE_PARAM = 0,  /* bf16 parameters */
	VPS_STATE_MAIN_PARAM, /* fp32 master parameters */
	VPS_STATE_EXP_AVG,    /* Adam first moment, fp32 */
	VPS_STATE_EXP_AVG_SQ, /* Adam second moment, fp32 */
	VPS_STATE_GRAD,       /* fp32 main gradients (optional) */
	VPS_STATE_MODULE,     /* fp32 module buffers (the routers' expert_bias): the
			       * one state of a module-buffer tensor */
	VPS_STATE_MOMENTUM,   /* momentum_buffer: SGD's and Muon's momentum, fp32 */
	VPS_NSTATES
};

/* Values are in files and registries: appended, never renumbered. */
enum vps_dtype {
	VPS_DTYPE_BF16 = 0,
	VPS_DTYPE_FP32 = 1,
	VPS_DTYPE_INT16 = 2, /* the low 16 bits of fp32 main params whose high 16 are the
			      * bf16 params' (TransformerEngine's store_param_remainders) */
};

VPS_API const char *vps_state_name(enum vps_state state);
/* @return VPS_EINPUT for an unknown name. */
VPS_API vps_result_t vps_state_parse(const char *name, int *state);
VPS_API const char *vps_dtype_name(enum vps_dtype dtype);
VPS_API vps_result_t vps_dtype_parse(const char *name, int *dtype);
VPS_API size_t vps_dtype_size(enum vps_dtype dtype);
/* A state's dtype under Megatron's defaults (bf16 params, fp32 for the
 * rest); a layout's own, which the precision-aware optimizer changes, is
 * vps_layout_state_dtype's, and every region and piece carries it. */
VPS_API enum vps_dtype vps_state_dtype(enum vps_state state);
/* A region's or piece's dtype field (1 + enum vps_dtype, or 0 for the
 * state's usual one, so that one built by hand keeps its meaning) as the
 * dtype it says. */
static inline enum vps_dtype vps_dtype_of(uint8_t field, int state)
{
	return field ? (enum vps_dtype)(field - 1) : vps_state_dtype((enum vps_state)state);
}
static inline uint8_t vps_dtype_field(enum vps_dtype dtype) { return (uint8_t)(dtype + 1); }
static inline enum vps_dtype vps_region_dtype(const struct vps_region *r) { return vps_dtype_of(r->dtype, r->state); }

struct vps_coords {
	int64_t tp, cp, dp, pp;  /* dense generator, order tp-cp-dp-pp */
	int64_t etp, ep, edp;    /* expert generator */
};

struct vps_buffer {
	uint32_t id;
	uint8_t state;
	uint8_t dtype;
	int32_t chunk;
	bool expert;   /* the expert-parallel buffer (sharded over EDP); a buffer
			* of state module_buffer is the chunk's module buffers */
	bool sharded;  /* a ZeRO-1 shard: this rank's part of every bucket */
	bool layerwise; /* the layer-wise optimizer's buffer (Muon, Lion with zero=1):
			 * its 2-D weights, each whole in one DP rank's part of its bucket */
	bool host;      /* in host memory: the offloaded part of an optimizer state
			 * (offload=F); its buffer on the GPU keeps the rest */
	int64_t elements;
};

/* One parameter (a torch.nn.Parameter) of one rank, or one module buffer
 * (its tensor is a module_buffer one; it lives in the chunk's buffer of
 * state module_buffer). */
struct vps_param {
	uint32_t tensor;       /* logical tensor (the word embeddings for a tied output copy) */
	int32_t chunk;
	int32_t local_layer;   /* layer index inside the chunk, or -1 */
	int32_t local_expert;  /* expert index on the rank, or -1 */
	bool output_copy;      /* output_layer.weight holding the tied embeddings */
	bool expert;           /* lives in the expert buffer */
	bool layerwise;        /* lives in the layer-wise optimizer's buffer */
	int64_t offset;        /* in the buffer of its (chunk, dense/expert) */
	int64_t elements;      /* local elements, vocabulary padding included */
	int32_t bucket;        /* family dtensor: the parameter's index in its model part */
	/* The local tensor's shape where the family gives it: a DTensor
	 * layout's local shard (FSDP2's padding left out; each parameter is
	 * then a buffer of its own, offset 0). ndim 0 in Megatron's, whose
	 * local shape python/vps computes from the split. */
	int32_t ndim;
	int64_t shape[VPS_MAX_DIMS];
};

/* A rank's sub-VPS. */
struct vps_rank_view {
	int64_t rank;
	struct vps_device device;
	struct vps_coords coords;
	struct vps_buffer *buffers;
	size_t nbuffers;
	struct vps_param *params;
	size_t nparams;
	struct vps_region *regions;
	size_t nregions;
	uint32_t *region_param;  /* index into params per region */
	char **region_names;     /* explicit views: the `param:` name as read */
};

VPS_API void vps_rank_view_release(struct vps_rank_view *v);

struct vps_layout;

/* Build a layout. p is validated against m (and its etp default filled);
 * where prefixes messages. The devices are copied. */
VPS_API vps_result_t vps_layout_new(struct vps_layout **out, const struct vps_model *m, const struct vps_parallel *p,
			    const struct vps_devices *d, const char *where);
VPS_API void vps_layout_free(struct vps_layout *l);

VPS_API const struct vps_model *vps_layout_model(const struct vps_layout *l);
VPS_API const struct vps_parallel *vps_layout_parallel(const struct vps_layout *l);
VPS_API const struct vps_devices *vps_layout_devices(const struct vps_layout *l);
VPS_API int64_t vps_layout_world(const struct vps_layout *l);
/* Whether experts sit in their own buffer (EP > 1 or ETP != TP). */
VPS_API bool vps_layout_expert_buffer(const struct vps_layout *l);
VPS_API struct vps_device vps_layout_device(const struct vps_layout *l, int64_t rank);
/* Rank on a device, or -1 when the layout does not use it. */
VPS_API int64_t vps_layout_rank_on(const struct vps_layout *l, struct vps_device dev);
VPS_API void vps_layout_coords(const struct vps_layout *l, int64_t rank, struct vps_coords *c);
/* Identity of the layout: model, configuration, devices and any explicit
 * rank that differs from what the rules give. */
VPS_API uint64_t vps_layout_hash(const struct vps_layout *l);
/* How many parameter states the layout holds (module_buffer aside): param,
 * main_param, grad when configured, and the optimizer's (exp_avg and
 * exp_avg_sq for Adam, exp_avg for Lion, momentum_buffer for SGD and Muon;
 * Muon and Lion leave what is not a 2-D weight to their scalar optimizer,
 * so such a layout holds both's). */
VPS_API int vps_layout_nstates(const struct vps_layout *l);
/* Whether the layout holds the state at all: for some parameter, or
 * module_buffer in a model with module buffers. */
VPS_API bool vps_layout_has_state(const struct vps_layout *l, enum vps_state state);
/* Whether tensor t is held in the state: a parameter in param, main_param,
 * grad (grad=1) and the states of the optimizer that steps it; a module
 * buffer in module_buffer only. */
VPS_API bool vps_layout_tensor_has_state(const struct vps_layout *l, const struct vps_tensor *t, enum vps_state state);
/* Whether the state is stored as ZeRO shards (in the dense buffers; with the
 * layer-wise optimizer and a dp_cp group of 1, its expert buffers keep whole
 * copies, as Megatron's shard_params does). */
VPS_API bool vps_layout_state_sharded(const struct vps_layout *l, enum vps_state state);
/* The dtype the layout holds a state in: vps_state_dtype's but under the
 * precision-aware optimizer (main_param int16 remainders, bf16 moments when
 * asked for). */
VPS_API enum vps_dtype vps_layout_state_dtype(const struct vps_layout *l, enum vps_state state);
/* Whether Megatron's optimizers step tensor t as a matrix: with Muon or
 * Lion, the 2-D weights other than the word embeddings and the output layer
 * (layer_wise_optimizer.py is_managed_by_layer_wise_optimizer); their
 * scalar optimizer takes the rest. */
VPS_API bool vps_layout_tensor_matrix(const struct vps_layout *l, const struct vps_tensor *t);
/* The optimizer that steps tensor t (enum vps_optimizer), or -1 for a
 * module buffer, which none steps. */
VPS_API int vps_layout_tensor_optimizer(const struct vps_layout *l, const struct vps_tensor *t);
/* VPS_EINPUT, naming the first state of one that the other does not hold
 * alike (a tensor in it under one and not the other, or another dtype), when
 * a plan between the two would have to drop or convert it: switching
 * optimizers is not a move of state. */
VPS_API vps_result_t vps_layout_states_match(const struct vps_layout *a, const struct vps_layout *b);

/* Compute (or copy, for an explicit rank) rank's sub-VPS. */
VPS_API vps_result_t vps_layout_rank(const struct vps_layout *l, int64_t rank, struct vps_rank_view *out);

/* The name of one of a rank's parameters inside its model chunk, as
 * named_parameters() gives it: chunk-local layer, rank-local expert, the
 * tied output copy as output_layer.weight, grouped-GEMM experts as
 * mlp.experts.linear_fc1.weight{i}. @return the length of the full name. */
VPS_API size_t vps_layout_param_name(const struct vps_layout *l, const struct vps_param *p, char *buf, size_t n);

/* Elements of a rank's buffer, or -1 when there is no such buffer. */
VPS_API int64_t vps_layout_buffer_elements(const struct vps_layout *l, int64_t rank, uint32_t buffer);

/* Ranks base + i*stride for i < count hold `region` (same buffer, same
 * addresses on each). */
struct vps_holder {
	struct vps_region region;
	int64_t base, stride, count;
};

struct vps_holders {
	struct vps_holder *v;
	size_t n, cap;
};
VPS_API void vps_holders_release(struct vps_holders *h);

/* Append to h every region of (tensor, state) that intersects box, with the
 * ranks holding it. Regions are whole (not clipped to box). */
VPS_API vps_result_t vps_layout_holders(const struct vps_layout *l, uint32_t tensor, enum vps_state state,
			const struct vps_box *box,
				struct vps_holders *h);

/* Replace rank's view by an explicit one (ownership of v's arrays moves to
 * the layout; *v is cleared). */
VPS_API vps_result_t vps_layout_set_explicit(struct vps_layout *l, struct vps_rank_view *v);
VPS_API size_t vps_layout_num_explicit(const struct vps_layout *l);
VPS_API int64_t vps_layout_explicit_rank(const struct vps_layout *l, size_t i);

/* ---- statistics over the whole layout, computed per pipeline stage ---- */
struct vps_layout_stats {
	int64_t parameters;       /* logical elements of all parameter tensors */
	uint32_t tensors;
	int64_t world;
	int64_t edp;
	int64_t max_rank_bytes;   /* largest sum of buffer bytes on a rank */
	int64_t min_rank_bytes;
	int64_t total_bytes;      /* over all ranks */
	int64_t logical_bytes;    /* every (tensor, state) once */
	int64_t padding_elements; /* buffer elements no region covers, over all ranks */
	int64_t max_rank_regions;
	int64_t buckets;          /* per rank, largest count */
};
VPS_API vps_result_t vps_layout_stats(const struct vps_layout *l, struct vps_layout_stats *s);

/* ---- files ---- */
/* Read a layout document (YAML or binary). */
VPS_API vps_result_t vps_layout_parse(struct vps_layout **out, const char *name, const void *data, size_t len);
VPS_API vps_result_t vps_layout_load(struct vps_layout **out, const char *path);
/* Serialize; ranks lists the ranks to write as explicit views (in
 * addition to those already explicit). */
struct vps_bytes;
VPS_API vps_result_t vps_layout_serialize(const struct vps_layout *l, const int64_t *ranks, size_t nranks, bool yaml,
				  struct vps_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
