/* Packed pieces: a global plan's pieces as bytes, about an eighth of their
 * struct size. Fresh memory is what a global plan at 16,384 ranks spends
 * most on (4.3 million pieces are 790 MB as structs, and touching a page the
 * first time costs more than planning what goes in it), so the planner's
 * threads pack each block of destinations and the plan keeps the blocks. */
#ifndef VPS_PLAN_PACK_H
#define VPS_PLAN_PACK_H

#include "vps/plan.h"

struct vps_packed_block {
	unsigned char *data;
	size_t len, cap;
	size_t npieces;
};

struct vps_packed {
	struct vps_packed_block *v;
	size_t n, cap;
	bool hashed;
	uint64_t hash; /* the plan hash after the pieces (vps_piece_hash), when hashed */
};

/* Append x to block b; prev is the piece appended before it in b (or a
 * zeroed piece for the first), which the encoding is relative to. */
vps_result_t vps_pack_piece(struct vps_packed_block *b, const struct vps_piece *prev, const struct vps_piece *x);
void vps_packed_free(struct vps_packed *pk);

#endif
