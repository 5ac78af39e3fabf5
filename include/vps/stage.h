/* Staged plans: the exact sequence every rank executes.
 *
 * Every transfer between world ranks i and j belongs to XOR step s = i ^ j
 * (steps 1 .. 2^ceil(log2 W) - 1); retains (local copies) are step 0. A step
 * whose transfers exceed the memory budget is cut in chunks. Stages group
 * consecutive (step, chunk) units so that on every rank the stage's send
 * plus receive buffers fit the budget; within a stage all transfers are in
 * flight at once. A step pairs each rank with at most one peer, so a rank
 * has one send and one receive buffer per peer per stage.
 *
 * Stage boundaries are a function of the budget and one number per step,
 * the step's demand: the most any rank sends plus receives in it, or, for a
 * step some rank needs several chunks for, that chunk count. Each rank
 * computes its own demands from its own transfers; the maximum over the
 * ranks (an all-reduce of O(steps) numbers at the start of a switch, or a
 * maximum taken here for a global plan) cuts the stages. A rank's staged
 * plan made from its own one-rank plan is therefore not cut (cut false, no
 * stage table, every transfer's stage -1) until its executor has the
 * world's demands.
 *
 * A transfer is a list of copy operations. Each operation names the source
 * view (an A buffer of the sender), the destination view (a B buffer of the
 * receiver) and where its bytes sit in the transfer's staging buffer
 * (256-byte aligned): the sender packs with the source views, the receiver
 * unpacks with the destination views, both read the same list. Consecutive
 * plan pieces contiguous in both source and destination are merged into one
 * flat operation. */
#ifndef VPS_STAGE_H
#define VPS_STAGE_H

#include "vps/plan.h"
#include "vps/units.h" /* vps_parse_bytes, for budgets */

#ifdef __cplusplus
extern "C" {
#endif

#define VPS_STAGE_ALIGN 256
/* The smallest budget: each direction of a unit must hold one aligned
 * element. */
#define VPS_STAGE_BUDGET_FLOOR ((int64_t)4096)
/* Above this many chunks a budget is refused as a mistake (it names the
 * smallest budget that stays under). */
#define VPS_STAGE_MAX_CHUNKS ((int64_t)10000000)

/* A transfer of hop h (vps_buffer_hop of its ops' src_buffer: 0 direct,
 * 1 .. VPS_MAX_HOP a relay passing on what it received) between ranks i
 * and j belongs to step h steps + (i ^ j), and a stage never holds two
 * hops: every hop h transfer is sent in a stage after every transfer of a
 * lower hop has arrived. */
#define VPS_STAGE_LAST_STEP(steps) ((VPS_MAX_HOP + 1) * (steps))

struct vps_op {
	int64_t piece;        /* first plan piece carried */
	int32_t npieces;      /* plan pieces carried (merged), the first and last possibly in part */
	uint8_t esize;        /* bytes per element */
	int ndim;
	int64_t ext[VPS_MAX_DIMS];
	uint32_t src_buffer, dst_buffer;
	int64_t src_offset, dst_offset; /* elements */
	int64_t src_strides[VPS_MAX_DIMS], dst_strides[VPS_MAX_DIMS];
	int64_t staging;      /* byte offset in the transfer's buffer; -1 for a retain */
};

struct vps_xfer {
	int64_t src, dst;     /* world ranks; equal for retains */
	int64_t step, chunk;
	int64_t stage;
	int64_t bytes;        /* staging buffer size, alignment included (0 for retains) */
	size_t first_op, nops;
};

struct vps_stage_info {
	int64_t first_unit_step, first_unit_chunk;
	int64_t last_unit_step, last_unit_chunk;
	int64_t bytes;        /* moved in this stage by the transfers the staged plan holds */
	int64_t peak;         /* the most one rank's send + receive buffers may take: the sum
			       * of the stage's demands (chunk c of a cut step: 2 chunk sizes) */
};

struct vps_staged {
	struct vps_plan *plan;      /* owned; the pieces ops refer to */
	int64_t budget;             /* bytes, the global minimum */
	int64_t scope;              /* -1: all ranks; otherwise the rank written */
	int64_t steps;              /* 2^ceil(log2 W) - 1 */
	bool cut;                   /* stages known (always, for a global plan's staging) */
	struct vps_stage_info *stages;
	size_t nstages;
	struct vps_xfer *xfers;     /* sorted by (stage, step, chunk, src, dst) */
	size_t nxfers;
	struct vps_op *ops;
	size_t nops;
	/* the last unit (step, chunk) that reads each A buffer of a world rank
	 * (step -1: never read), and its stage once cut (-1: free at once) */
	struct vps_free {
		int64_t rank;
		uint32_t buffer;
		int64_t step, chunk;
		int64_t stage;
	} *frees;
	size_t nfrees;
	uint64_t file_hash;
};

/* 2^ceil(log2 W) - 1: the XOR steps of a world of W ranks. */
VPS_API int64_t vps_stage_steps(int64_t W);

/* Per-rank budgets: the smallest rules. */
VPS_API vps_result_t vps_budgets_load(const char *path, int64_t *min_budget);

/* Stage a plan within budget bytes. For a global plan, rank >= 0 keeps only
 * that rank's transfers (the stages are those of the whole world). A
 * one-rank plan (rank -1 or its own) gives that rank's staged plan, not yet
 * cut. Takes ownership of the plan on success. */
VPS_API vps_result_t vps_stage(struct vps_staged **out, struct vps_plan *plan, int64_t budget, int64_t rank);
VPS_API void vps_staged_free(struct vps_staged *s);

/* The demands of every step 0 .. steps, three numbers each (all 0: no
 * transfer): the chunk count, what the last chunk costs and what the first
 * chunk costs the busiest rank in the staged plan's scope (bytes sent plus
 * received in that unit). Step 0 is [R, 0, F]: R 1 when some rank retains,
 * F the most hops of any transfer (0: no forward). The forward steps
 * steps + 1 .. (VPS_MAX_HOP + 1) steps follow (VPS_DEMAND_FORWARD_COUNT
 * numbers, all 0 past (F + 1) steps): the executors all-reduce the first
 * VPS_DEMAND_FORWARD_AGREED(steps, F) of them only when the world's F is
 * above 0, so a plan without relays agrees on VPS_DEMAND_COUNT numbers, as
 * before relays. The world's demands combine every rank's with
 * vps_stage_demand_combine. */
#define VPS_DEMAND_COUNT(steps) ((size_t)3 * (size_t)((steps) + 1))
#define VPS_DEMAND_FORWARD_COUNT(steps) ((size_t)3 * VPS_MAX_HOP * (size_t)(steps))
#define VPS_DEMAND_FORWARD_AGREED(steps, hops) ((size_t)3 * (size_t)(hops) * (size_t)(steps))
#define VPS_DEMAND_HOPS(demand) ((demand)[2])
#define VPS_DEMAND_HAS_FORWARDS(demand) ((demand)[2] != 0)
/* *demand: VPS_DEMAND_COUNT + VPS_DEMAND_FORWARD_COUNT numbers. */
VPS_API vps_result_t vps_staged_demand(const struct vps_staged *s, int64_t **demand);
/* acc = acc combined with in (n numbers, a multiple of 3): the largest
 * chunk count with the costliest last chunk among the ranks that have that
 * many, and the costliest first chunk. Associative and commutative. */
VPS_API void vps_stage_demand_combine(int64_t *acc, const int64_t *in, size_t n);
/* Cut the stages from the world's demands (the forward steps read only
 * when VPS_DEMAND_HAS_FORWARDS): fills the stage table, every
 * transfer's stage and the frees' stages. A staged plan already cut must
 * come out the same (else VPS_EINPUT: its ranks' files disagree). */
VPS_API vps_result_t vps_staged_cut(struct vps_staged *s, const int64_t *demand);
/* The stage of unit (step, chunk) in a cut staged plan, or -1. */
VPS_API int64_t vps_staged_stage_of(const struct vps_staged *s, int64_t step, int64_t chunk);

struct vps_stage_stats {
	int64_t stages, steps_used, units;
	int64_t bytes_moved, bytes_retained;
	int64_t peak_max;           /* largest transient memory of a rank over stages */
	int64_t pieces;             /* copies before merging */
	int64_t ops;                /* copies after merging */
	int64_t transfers;
};
VPS_API void vps_staged_stats(const struct vps_staged *s, struct vps_stage_stats *st);

VPS_API uint64_t vps_staged_hash(const struct vps_staged *s);
/* What every rank's file of one staging shares (the global plan, budget,
 * steps, stages), whether it holds all transfers or one rank's: ranks
 * compare it before a byte moves. */
VPS_API uint64_t vps_staged_world_hash(const struct vps_staged *s);
struct vps_bytes;
VPS_API vps_result_t vps_staged_serialize(const struct vps_staged *s, bool yaml, struct vps_bytes *out);
VPS_API vps_result_t vps_staged_parse(struct vps_staged **out, const char *name, const void *data, size_t len);
VPS_API vps_result_t vps_staged_load(struct vps_staged **out, const char *path);

/* Bytes of one op. */
static inline int64_t vps_op_bytes(const struct vps_op *o)
{
	int64_t n = o->esize;
	for (int k = 0; k < o->ndim; k++)
		n *= o->ext[k];
	return n;
}

#ifdef __cplusplus
}
#endif

#endif
