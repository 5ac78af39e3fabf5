/* Layout internals shared by layout.c and layout_io.c. */
#ifndef VPS_LAYOUT_INT_H
#define VPS_LAYOUT_INT_H

#include "vps/layout.h"

/* One parameter slot of a (stage, chunk, dense/expert) buffer. Expert
 * slots name the tensor of expert `slot`; a rank of expert-parallel rank
 * ep holds expert ep * experts_per_rank + slot. */
struct tparam {
	uint32_t tensor;
	int32_t layer, local_layer, slot;
	bool output_copy, shared;
	int64_t elements, offset;
	int32_t bucket;
};

struct tbucket {
	int64_t lo, hi;      /* in the full buffer, padding included */
	int64_t shard_base;  /* where a DP rank's shard of it starts in the shard buffer */
};

/* The buffer layout shared by every rank of a pipeline stage: parameter
 * shapes do not depend on the TP, EP or DP rank. */
struct tparam_ref {
	uint32_t tensor, idx;
};

struct tmpl {
	struct tparam *p; /* registration order */
	size_t n;
	/* p's indices by tensor (the output copy left out): registration order
	 * is tensor order except for grouped-GEMM experts */
	struct tparam_ref *by_tensor;
	size_t nby_tensor;
	struct tbucket *b;
	size_t nb;
	int64_t elements;       /* buffer size with padding */
	int64_t shard_elements; /* ZeRO shard buffer size */
	int64_t dpsize;
	int64_t output_copy_idx;
	uint32_t states;        /* the states its parameters have (1 << enum vps_state) */
};

struct explicit_entry {
	uint32_t tensor;
	uint8_t state;
	uint32_t view, region;
};

struct vps_layout {
	struct vps_model m;
	struct vps_parallel p;
	struct vps_devices d;
	int64_t world, edp;
	int64_t experts_per_rank;
	uint32_t nexpert_kinds;
	bool expert_buffer;
	bool layerwise;  /* Muon or Lion with zero=1: Megatron's layer-wise optimizer */
	struct tmpl *tm; /* [stage][chunk][group] */
	struct vps_rank_view *ex; /* explicit ranks, sorted */
	size_t nex;
	struct explicit_entry *exidx; /* sorted by (tensor, state) */
	size_t nexidx;
	uint64_t hash;
	bool hash_ready;
	struct dtensor *dt; /* family dtensor's parameters (dtensor.c); NULL in Megatron's */
};

/* A contiguous part of a rank's local tensor: box in logical coordinates,
 * stored row-major at local offset loc. */
struct piece {
	struct vps_box box;
	int64_t loc;
};

int64_t vps_layout_local_elements(const struct vps_layout *l, const struct vps_tensor *t);
/* Pieces of tensor t held by tensor-parallel rank ti (at most 2*ndim-1). */
int vps_layout_pieces(const struct vps_layout *l, const struct vps_tensor *t, int64_t ti, struct piece *out);
/* The rank's view from the rules, ignoring any explicit entry. */
vps_result_t vps_layout_computed_rank(const struct vps_layout *l, int64_t rank, struct vps_rank_view *v);

#endif
