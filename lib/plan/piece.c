/* Pieces (plan/piece.h): bytes, hashes, and the one geometry of how copies
 * carry them, shared by staging, the queries and vps-verify. */
#include <inttypes.h>

#include "util/hash.h"
#include "util/internal.h"
#include "plan/piece.h"
#include "plan/plan_pack.h"

int64_t vps_piece_bytes(const struct vps_piece *p)
{
	return vps_box_volume(&p->box) * (int64_t)vps_dtype_size(vps_piece_dtype(p));
}

vps_result_t vps_plan_transit_bytes(const struct vps_plan *p, int64_t w, int64_t *bytes)
{
	struct vps_piece_iter it;
	const struct vps_piece *x;
	*bytes = 0;
	vps_piece_iter_init(&it, p);
	while ((x = vps_piece_iter_next(&it))) {
		if (x->dst != w || !vps_piece_to_transit(x))
			continue;
		int64_t ext[VPS_MAX_DIMS], first, end, b;
		for (int k = 0; k < x->box.ndim; k++)
			ext[k] = x->box.hi[k] - x->box.lo[k];
		if (!vps_view_span(x->box.ndim, ext, x->dst_offset, x->dst_strides, &first, &end) || first < 0 ||
		    end > VPS_MAX_ELEMENTS || !vps_mul_ok(end, (int64_t)vps_dtype_size(vps_piece_dtype(x)), &b))
			return vps_fail(VPS_EINPUT, "a piece into world rank %" PRId64 "'s transit area reaches beyond "
					"2^48 elements", w);
		*bytes = vps_max64(*bytes, b);
	}
	return VPS_OK;
}

/* ---- how copies carry pieces ---- */

bool vps_run_flat(const struct vps_run *r)
{
	return vps_strides_rowmajor(r->ndim, r->ext, r->src_strides) &&
	       vps_strides_rowmajor(r->ndim, r->ext, r->dst_strides);
}

bool vps_piece_flat(const struct vps_piece *x)
{
	int64_t ext[VPS_MAX_DIMS];
	for (int k = 0; k < x->box.ndim; k++)
		ext[k] = x->box.hi[k] - x->box.lo[k];
	return vps_strides_rowmajor(x->box.ndim, ext, x->src_strides) &&
	       vps_strides_rowmajor(x->box.ndim, ext, x->dst_strides);
}

/* Staging makes a run of every piece, and matching one of each strided
 * piece a copy names: fields are set one by one, no memset. */
bool vps_piece_run(const struct vps_piece *x, struct vps_run *r)
{
	int64_t n = 1;
	r->src = x->src;
	r->dst = x->dst;
	r->ndim = x->box.ndim;
	r->esize = (uint8_t)vps_dtype_size(vps_piece_dtype(x));
	r->src_buffer = x->src_buffer;
	r->dst_buffer = x->dst_buffer;
	r->src_offset = x->src_offset;
	r->dst_offset = x->dst_offset;
	for (int k = 0; k < VPS_MAX_DIMS; k++) {
		bool axis = k < r->ndim;
		r->ext[k] = axis ? x->box.hi[k] - x->box.lo[k] : 0;
		r->src_strides[k] = axis ? x->src_strides[k] : 0;
		r->dst_strides[k] = axis ? x->dst_strides[k] : 0;
		n *= axis ? r->ext[k] : 1;
	}
	if (!vps_run_flat(r))
		return false;
	for (int k = 1; k < VPS_MAX_DIMS; k++)
		r->ext[k] = r->src_strides[k] = r->dst_strides[k] = 0;
	r->ndim = 1;
	r->ext[0] = n;
	r->src_strides[0] = r->dst_strides[0] = 1;
	return true;
}

/* Where copy c starts in strided run r, solved from one side's offset:
 * along the axes c does not span whole, largest stride first, as far as
 * the offset goes and the copy still fits. @return false when no such
 * start reaches c's offset on that side. */
static bool solve_start(const struct vps_run *r, const struct vps_run *c, bool dst_side, int64_t *lo)
{
	const int64_t *st = dst_side ? r->dst_strides : r->src_strides;
	int64_t delta;
	bool used[VPS_MAX_DIMS] = {false};
	for (int k = 0; k < VPS_MAX_DIMS; k++)
		lo[k] = 0;
	if (__builtin_sub_overflow(dst_side ? c->dst_offset : c->src_offset, dst_side ? r->dst_offset : r->src_offset,
				   &delta) ||
	    delta < 0)
		return false;
	for (int n = 0; n < r->ndim; n++) {
		int best = -1;
		for (int k = 0; k < r->ndim; k++)
			if (!used[k] && r->ext[k] > c->ext[k] && (best < 0 || st[k] > st[best]))
				best = k;
		if (best < 0)
			break;
		used[best] = true;
		if (st[best] <= 0)
			return false;
		lo[best] = vps_min64(delta / st[best], r->ext[best] - c->ext[best]);
		delta -= lo[best] * st[best];
	}
	return delta == 0;
}

enum vps_match vps_piece_match(const struct vps_piece *x, const struct vps_run *c, struct vps_box *sub)
{
	struct vps_run r;
	if (vps_piece_flat(x))
		return vps_run_flat(c) ? VPS_MATCH_FLAT : VPS_MATCH_NONE;
	vps_piece_run(x, &r);
	if (c->ndim != r.ndim || c->src != r.src || c->dst != r.dst || c->src_buffer != r.src_buffer ||
	    c->dst_buffer != r.dst_buffer || c->esize != r.esize)
		return VPS_MATCH_NONE;
	for (int k = 0; k < r.ndim; k++) {
		if (c->ext[k] < 1 || c->ext[k] > r.ext[k])
			return VPS_MATCH_NONE;
		if (c->ext[k] > 1 && (c->src_strides[k] != r.src_strides[k] || c->dst_strides[k] != r.dst_strides[k]))
			return VPS_MATCH_NONE;
	}
	for (int side = 0; side < 2; side++) {
		int64_t lo[VPS_MAX_DIMS];
		struct vps_run part;
		if (!solve_start(&r, c, side, lo) || !vps_run_part(&r, lo, c->ext, &part) ||
		    part.src_offset != c->src_offset || part.dst_offset != c->dst_offset)
			continue;
		sub->ndim = r.ndim;
		for (int k = 0; k < r.ndim; k++) {
			sub->lo[k] = lo[k];
			sub->hi[k] = lo[k] + c->ext[k];
		}
		return VPS_MATCH_BOX;
	}
	return VPS_MATCH_NONE;
}

/* ---- hashes ---- */

uint64_t vps_plan_hash_start(const struct vps_plan *p)
{
	uint64_t h = vps_layout_hash(p->a);
	h = vps_hash64(&h, 8, vps_layout_hash(p->b));
	return vps_hash64(&p->scope, sizeof(p->scope), h);
}

uint64_t vps_piece_hash(const struct vps_piece *x, uint64_t h)
{
	int64_t f[8 + 4 * VPS_MAX_DIMS] = {x->tensor, x->state, x->src, x->dst, x->src_buffer, x->dst_buffer,
					   x->src_offset, x->dst_offset};
	for (int k = 0; k < x->box.ndim; k++) {
		f[8 + k] = x->box.lo[k];
		f[8 + VPS_MAX_DIMS + k] = x->box.hi[k];
		f[8 + 2 * VPS_MAX_DIMS + k] = x->src_strides[k];
		f[8 + 3 * VPS_MAX_DIMS + k] = x->dst_strides[k];
	}
	return vps_hash64(f, sizeof(f), h);
}

uint64_t vps_relay_hash(const struct vps_plan *p, uint64_t h)
{
	if (p->relay == VPS_RELAY_ALWAYS)
		return vps_hash64("relay", 5, h);
	if (p->relay != VPS_RELAY_AUTO)
		return h;
	h = vps_hash64("relay-auto", 10, h);
	double bw[] = {p->relay_intra_bandwidth, p->relay_inter_bandwidth};
	return bw[0] > 0 ? vps_hash64(bw, sizeof(bw), h) : h;
}

uint64_t vps_plan_hash(const struct vps_plan *p)
{
	uint64_t h;
	if (p->packed && p->packed->hashed) {
		/* hashed as the planner packed it; packed pieces do not change */
		h = p->packed->hash;
	} else {
		struct vps_piece_iter it;
		const struct vps_piece *x;
		h = vps_plan_hash_start(p);
		vps_piece_iter_init(&it, p);
		while ((x = vps_piece_iter_next(&it)))
			h = vps_piece_hash(x, h);
	}
	for (size_t i = 0; i < p->ncolls; i++) {
		const struct vps_collective *c = &p->colls[i];
		int64_t f[] = {c->tensor, c->state, c->kind, c->root, c->peers, c->bytes};
		h = vps_hash64(f, sizeof(f), h);
	}
	const struct vps_training *t = &p->train;
	int64_t tf[] = {t->known, t->step, t->consumed_samples, t->scheduler_step, t->global_batch, t->micro_batch,
			t->grad_accum, t->dp};
	h = vps_hash64(tf, sizeof(tf), h);
	/* a plan with no lost rank hashes as before there were any */
	if (p->lost.nranks) {
		h = vps_hash64(p->lost.ranks, p->lost.nranks * sizeof(*p->lost.ranks), h);
		for (size_t i = 0; i < p->lost.nranges; i++) {
			const struct vps_lost_range *x = &p->lost.ranges[i];
			int64_t f[2 + 2 * VPS_MAX_DIMS] = {x->tensor, x->state};
			for (int k = 0; k < x->box.ndim; k++) {
				f[2 + k] = x->box.lo[k];
				f[2 + VPS_MAX_DIMS + k] = x->box.hi[k];
			}
			h = vps_hash64(f, sizeof(f), h);
		}
	}
	/* and one planned without relays as before them, one with
	 * VPS_RELAY_ALWAYS as plans of vps-plan --relay did */
	h = vps_relay_hash(p, h);
	/* 0 marks a plan computed here (file_hash): no file may state it */
	return h ? h : 1;
}
