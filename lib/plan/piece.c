/* Pieces (plan/piece.h): bytes, hashes, and the one geometry of how copies
 * carry them, shared by staging, the queries and vps-verify. */
#include "io/doc.h"
#include "util/internal.h"
#include "plan/piece.h"
#include "plan/plan_pack.h"

int64_t vps_piece_bytes(const struct vps_piece *p)
{
	return vps_box_volume(&p->box) * (int64_t)vps_dtype_size(vps_state_dtype(p->state));
}

/* ---- how copies carry pieces ---- */

bool vps_run_flat(const struct vps_run *r)
{
	return vps_strides_rowmajor(r->ndim, r->ext, r->src_strides) &&
	       vps_strides_rowmajor(r->ndim, r->ext, r->dst_strides);
}

bool vps_piece_run(const struct vps_piece *x, struct vps_run *r)
{
	memset(r, 0, sizeof(*r));
	r->src = x->src;
	r->dst = x->dst;
	r->ndim = x->box.ndim;
	r->esize = (uint8_t)vps_dtype_size(vps_state_dtype(x->state));
	r->src_buffer = x->src_buffer;
	r->dst_buffer = x->dst_buffer;
	r->src_offset = x->src_offset;
	r->dst_offset = x->dst_offset;
	for (int k = 0; k < r->ndim; k++) {
		r->ext[k] = x->box.hi[k] - x->box.lo[k];
		r->src_strides[k] = x->src_strides[k];
		r->dst_strides[k] = x->dst_strides[k];
	}
	if (!vps_run_flat(r))
		return false;
	int64_t n = vps_box_volume(&x->box);
	memset(r->ext, 0, sizeof(r->ext));
	memset(r->src_strides, 0, sizeof(r->src_strides));
	memset(r->dst_strides, 0, sizeof(r->dst_strides));
	r->ndim = 1;
	r->ext[0] = n;
	r->src_strides[0] = r->dst_strides[0] = 1;
	return true;
}

bool vps_piece_flat(const struct vps_piece *x)
{
	struct vps_run r;
	return vps_piece_run(x, &r);
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
	/* 0 marks a plan computed here (file_hash): no file may state it */
	return h ? h : 1;
}
