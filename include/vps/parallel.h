/* Parallel configurations and device maps. */
#ifndef VPS_PARALLEL_H
#define VPS_PARALLEL_H

#include "vps/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bucket: one bucket per buffer (Megatron's default, --overlap-grad-reduce off) */
#define VPS_BUCKET_NONE 0
/* bucket: Megatron-LM's size with overlap on: max(40,000,000, 1,000,000 * dp * cp) */
#define VPS_BUCKET_AUTO (-1)

/* family: whose rules lay the configuration out */
#define VPS_FAMILY_MEGATRON 0 /* Megatron-Core: DDP buffers, the distributed optimizer */
#define VPS_FAMILY_DTENSOR 1  /* PyTorch DTensor: FSDP2, HSDP, TP, PP and EP as torchtitan applies them */

/* Megatron-LM's --optimizer (values are in files: appended, never renumbered). */
enum vps_optimizer { VPS_OPT_ADAM = 0, VPS_OPT_SGD = 1, VPS_OPT_MUON = 2, VPS_OPT_LION = 3, VPS_NOPTIMIZERS };

VPS_API const char *vps_optimizer_name(int optimizer);
/* @return VPS_EINPUT for an unknown name. */
VPS_API vps_result_t vps_optimizer_parse(const char *name, int *optimizer);

struct vps_parallel {
	int64_t tp, pp, dp;
	int64_t cp;      /* context parallel: splits the sequence, every CP rank holds the same parameters */
	int64_t ep;      /* expert parallel */
	int64_t etp;     /* expert tensor parallel; 0 means "= tp" (Megatron's default) */
	int64_t vpp;     /* virtual pipeline chunks per stage */
	int64_t zero;    /* 0, or 1: distributed optimizer over DP */
	int64_t first;   /* layers on the first stage, 0: not set */
	int64_t last;    /* layers on the last stage, 0: not set */
	int64_t bucket;  /* VPS_BUCKET_NONE, VPS_BUCKET_AUTO or elements */
	bool grad;       /* fp32 gradients are part of the state */
	bool grouped_gemm; /* experts as TEGroupedMLP (--moe-grouped-gemm): linear_fc1.weight0..N-1 */
	/* Family dtensor: FSDP2's data-parallel mesh, as torchtitan names it
	 * (dp = dp_replicate * dp_shard; vpp is the pipeline stages a rank
	 * holds; docs/layout.md, "PyTorch DTensor layouts"). 1 in Megatron's. */
	int64_t family;       /* VPS_FAMILY_MEGATRON or VPS_FAMILY_DTENSOR */
	int64_t dp_replicate; /* HSDP replicas */
	int64_t dp_shard;     /* FSDP shards (fsdp= in a spec) */
	/* The optimizer: which states a parameter has, their dtypes, their
	 * sharding. Muon and Lion with zero=1 are Megatron's layer-wise
	 * distributed optimizer (--use-distributed-optimizer turns into it). */
	int32_t optimizer;        /* enum vps_optimizer (adam) */
	int32_t scalar_optimizer; /* muon's optimizer of everything it leaves
				   * (--muon-scalar-optimizer): adam or lion; lion's is adam */
	bool precision_aware;     /* --use-precision-aware-optimizer (adam, zero=1):
				   * TransformerEngine's FusedAdam keeps main params as
				   * int16 remainders of the bf16 params */
	bool exp_avg_bf16;        /* --exp-avg-dtype bf16 (precision_aware) */
	bool exp_avg_sq_bf16;     /* --exp-avg-sq-dtype bf16 (precision_aware) */
	/* --optimizer-cpu-offload --optimizer-offload-fraction F (adam,
	 * zero=1): Megatron's HybridDeviceOptimizer keeps the optimizer states
	 * of the first parameters of each rank's shard, in its optimizer's
	 * order, up to the fraction F of the shard's elements, in host memory
	 * (fp32 master params and moments, whatever the dtype flags); 0: none */
	double offload;
};

/* Defaults: everything 1, zero 0, one bucket, no grads, sequential experts,
 * family megatron, Adam in fp32. */
VPS_API void vps_parallel_init(struct vps_parallel *p);
/* "megatron" or "dtensor" ("?" for another value). */
VPS_API const char *vps_parallel_family_name(int64_t family);

/* Parse "tp=4,pp=2,dp=2,zero=1" (or a DTensor mesh, "dp_shard=4,tp=2":
 * a key of that family, dp_shard, fsdp, dp_replicate or family=dtensor,
 * selects it) on top of *p. where, when not NULL,
 * prefixes messages (a file's line, or what the caller calls the value). */
VPS_API vps_result_t vps_parallel_parse(struct vps_parallel *p, const char *spec, const char *where);

/* Load a parallel configuration: a spec string (contains '='), a file
 * path, or a name looked up as NAME.yaml in search_path (colon-separated
 * directories); VPS_ENOTFOUND when it is none of these. A configuration
 * file may name the model it was written for (`model:`); that name is
 * copied to model_hint ("" when none). */
VPS_API vps_result_t vps_parallel_load(struct vps_parallel *p, const char *arg, const char *search_path,
			       char *model_hint, size_t hint_len);

/* Check p against the model with Megatron's rules and fill etp's default.
 * where prefixes messages ("--parallel", "a.yaml: line 3"). */
VPS_API vps_result_t vps_parallel_validate(struct vps_parallel *p, const struct vps_model *m, const char *where);

/* tp * cp * dp * pp; vps_parallel_validate bounds it. */
static inline int64_t vps_parallel_world(const struct vps_parallel *p) { return p->tp * p->cp * p->dp * p->pp; }
/* Ranks that hold the same dense parameters and share its ZeRO shards: the
 * dp_cp group (Megatron's data-parallel group with context parallelism). */
static inline int64_t vps_parallel_dpcp(const struct vps_parallel *p) { return p->cp * p->dp; }
/* Expert data-parallel size: world / (etp * ep * pp); CP folds into it. */
static inline int64_t vps_parallel_edp(const struct vps_parallel *p)
{
	return p->tp * p->cp * p->dp / (p->etp * p->ep);
}

/* Format as "tp=4,pp=2,dp=2,ep=1,etp=4,vpp=1,zero=1", with ",cp=N" after dp
 * when cp is not 1 and only non-default extras at the end. */
VPS_API void vps_parallel_format(const struct vps_parallel *p, char *buf, size_t n);

/* offload as the shortest text that reads back as the same double. */
VPS_API void vps_offload_format(double f, char *buf, size_t n);

/* Layers on pipeline stage p, and the first layer of chunk v on stage p. */
VPS_API int64_t vps_parallel_stage_layers(const struct vps_parallel *p, const struct vps_model *m, int64_t stage);
VPS_API int64_t vps_parallel_chunk_first_layer(const struct vps_parallel *p, const struct vps_model *m,
				       int64_t stage, int64_t chunk);
/* Stage and chunk holding a layer. */
VPS_API void vps_parallel_layer_place(const struct vps_parallel *p, const struct vps_model *m, int64_t layer,
			      int64_t *stage, int64_t *chunk);

/* ---- devices ---- */

struct vps_device {
	int32_t node;
	int32_t gpu;
};

struct vps_devices {
	/* packed: rank r on (first_node + r / gpus_per_node, r % gpus_per_node) */
	bool packed;
	int64_t gpus_per_node;
	int64_t first_node;
	/* explicit: one device per rank */
	struct vps_device *list;
	int64_t n;
	/* explicit lists: sorted index for device -> rank (built on load) */
	int64_t *order;
};

VPS_API void vps_devices_packed(struct vps_devices *d, int64_t gpus_per_node, int64_t first_node);
/* Read a devices document (`vps: devices`, `devices: [[node, gpu], ...]`). */
VPS_API vps_result_t vps_devices_load(struct vps_devices *d, const char *path);
VPS_API vps_result_t vps_devices_copy(struct vps_devices *dst, const struct vps_devices *src);
VPS_API void vps_devices_release(struct vps_devices *d);
/* Check that the map covers world ranks with distinct devices. */
VPS_API vps_result_t vps_devices_validate(struct vps_devices *d, int64_t world, const char *where);
VPS_API struct vps_device vps_devices_get(const struct vps_devices *d, int64_t rank);
/* Ranks whose device is on node, in rank order; writes at most max.
 * @return how many there are. */
VPS_API size_t vps_devices_node_ranks(const struct vps_devices *d, int64_t world, int32_t node, int64_t *out, size_t max);
/* Rank on a device, or -1. */
VPS_API int64_t vps_devices_find(const struct vps_devices *d, int64_t world, struct vps_device dev);

#ifdef __cplusplus
}
#endif

#endif
