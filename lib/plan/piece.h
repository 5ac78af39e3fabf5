/* Pieces: their bytes, their hash, and how the copies of a staged plan
 * carry them.
 *
 * A piece whose elements are one contiguous range, the row-major order of
 * its box, on both sides is flat: staging sees it as one axis of all its
 * elements with strides 1, merges it with the flat pieces that continue it
 * on both sides and cuts the merged run anywhere. Any other piece is
 * strided: each copy of it is a sub-box with the piece's own addressing,
 * its strides and the offsets of the sub-box's first element. Staging makes
 * the copies with vps_piece_run and vps_run_part; vps-verify and the
 * queries over staged plans take them back to their pieces with
 * vps_piece_match, which solves what vps_run_part computes. */
#ifndef VPS_PIECE_H
#define VPS_PIECE_H

#include "util/internal.h"
#include "vps/plan.h"

/* Elements copied from a strided view of a source rank's buffer to one of a
 * destination rank's: a piece as staging copies it, or one copy of a staged
 * plan. Entries past ndim are 0. */
struct vps_run {
	int64_t src, dst; /* world ranks */
	int ndim;
	int64_t ext[VPS_MAX_DIMS];
	uint8_t esize; /* bytes per element */
	uint32_t src_buffer, dst_buffer;
	int64_t src_offset, dst_offset; /* elements, at the first element */
	int64_t src_strides[VPS_MAX_DIMS], dst_strides[VPS_MAX_DIMS];
};

/* Whether the run's elements are one contiguous range on both sides: the
 * row-major order of its extents (an extent of 1 may have any stride). */
bool vps_run_flat(const struct vps_run *r);

/* Piece x as staging copies it: a flat piece as one axis of all its
 * elements, strides 1; a strided one as its box.
 * @return whether the piece is flat. */
bool vps_piece_run(const struct vps_piece *x, struct vps_run *r);
bool vps_piece_flat(const struct vps_piece *x);

/* The part of run r that starts lo elements into it along each axis and
 * has extents ext: r's strides, offsets at the part's first element.
 * @return false when an offset overflows (a part outside any buffer).
 * Inline: staging cuts every copy with it. */
static inline bool vps_run_part(const struct vps_run *r, const int64_t *lo, const int64_t *ext, struct vps_run *out)
{
	int64_t src = r->src_offset, dst = r->dst_offset, t;
	for (int k = 0; k < r->ndim; k++)
		if (!vps_mul_ok(lo[k], r->src_strides[k], &t) || !vps_add_ok(src, t, &src) ||
		    !vps_mul_ok(lo[k], r->dst_strides[k], &t) || !vps_add_ok(dst, t, &dst))
			return false;
	*out = *r;
	for (int k = 0; k < r->ndim; k++)
		out->ext[k] = ext[k];
	out->src_offset = src;
	out->dst_offset = dst;
	return true;
}

enum vps_match {
	VPS_MATCH_NONE, /* the copy carries no part of the piece as staging cuts it */
	VPS_MATCH_FLAT, /* a flat piece and a flat copy: flat copies merge pieces, so
			 * which pieces one carries is a matter of addresses */
	VPS_MATCH_BOX,  /* a strided piece, and a sub-box of it (*sub) the copy carries */
};

/* What copy c carries of piece x. Of a strided piece, a copy carries the
 * sub-box *sub (counted from the piece's first element, 0 on every axis)
 * when it has the piece's ranks, buffers and element size, the piece's
 * strides along every axis longer than one element, and the offsets
 * vps_run_part gives that sub-box. The sub-box is solved from one side's
 * offset, largest stride first (exact when strides nest, as every layout's
 * do), then checked on both sides: a wrong box is never returned, and a
 * copy whose strides do not nest is not guessed. */
enum vps_match vps_piece_match(const struct vps_piece *x, const struct vps_run *c, struct vps_box *sub);

/* The plan hash in steps: its start, then each piece in order (what
 * vps_plan_hash does before the collectives and the training state). */
uint64_t vps_plan_hash_start(const struct vps_plan *p);
uint64_t vps_piece_hash(const struct vps_piece *x, uint64_t h);
/* h with the plan's relay mode (and the bandwidths VPS_RELAY_AUTO
 * weighed): nothing for none, so plans without relays hash as before them,
 * and "relay" for VPS_RELAY_ALWAYS, as plans of vps-plan --relay did. */
uint64_t vps_relay_hash(const struct vps_plan *p, uint64_t h);

#endif
