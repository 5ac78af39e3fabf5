/* The layout-independent digest of a rank's part: the box arithmetic that
 * finds what this rank is the lowest holder of, then a sum on the host or
 * one kernel over the GPU's buffers. */
#include "exec/digest.h"

#include "gpu/gpu.h"
#include "util/hash.h"
#include "util/internal.h"
#include "vps/data.h"
#include "vps/registry.h"

/* A part of a region as the kernel reads it: element (i0, ..) of the box
 * at buffer offset r->offset + sum ik * strides[k] is logical element
 * sum (lo[k] + ik) * (row-major stride of axis k) of its tensor, which is
 * how vps_digest_region walks it. */
static void part_view(const struct vps_region *r, const struct vps_tensor *t, const void *buffer,
		      struct vps_cuda_digest *v)
{
	int64_t tstr[VPS_MAX_DIMS], s = 1, flat = 0;
	for (int k = t->ndim - 1; k >= 0; k--) {
		tstr[k] = s;
		s *= t->shape[k];
	}
	memset(v, 0, sizeof(*v));
	v->esize = (int32_t)vps_dtype_size(vps_region_dtype(r));
	v->ndim = r->box.ndim;
	for (int k = 0; k < r->box.ndim; k++) {
		v->ext[k] = r->box.hi[k] - r->box.lo[k];
		v->strides[k] = r->strides[k];
		v->flat_strides[k] = tstr[k];
		flat += r->box.lo[k] * tstr[k];
	}
	v->flat = flat;
	v->key = vps_mix64(((uint64_t)r->tensor << 8) ^ r->state);
	v->addr = (uint64_t)(uintptr_t)buffer + (uint64_t)r->offset * (uint64_t)v->esize;
}

vps_result_t vps_exec_digest_part(const struct vps_layout *l, int64_t rank, void *const *buffers,
				  const struct vps_lost *lost, bool source, const uint8_t *where,
				  const struct vps_cuda_api *gpu, uint64_t *digest)
{
	struct vps_rank_view v;
	struct vps_holders h = {0};
	struct vps_boxes rem = {0}, scratch = {0};
	struct vps_cuda_digest *views = NULL;
	size_t nviews = 0, cap = 0;
	uint64_t sum = 0;
	vps_result_t rc;
	VPS_CHECK(vps_layout_rank(l, rank, &v));
	for (size_t i = 0; i < v.nregions; i++) {
		const struct vps_region *R = &v.regions[i];
		struct vps_tensor t;
		VPS_CHECK_GOTO(vps_model_tensor(vps_layout_model(l), R->tensor, &t), rc, done);
		h.n = 0;
		VPS_CHECK_GOTO(vps_layout_holders(l, R->tensor, R->state, &R->box, &h), rc, done);
		if (lost && source)
			VPS_CHECK_GOTO(vps_lost_drop_holders(lost, &h), rc, done);
		/* count only what no lower-numbered rank holds */
		size_t nholes = lost && !source ? lost->nranges : 0;
		VPS_CHECK_GOTO(vps_boxes_reset(&rem, &R->box), rc, done);
		for (size_t k = 0; k < h.n + nholes && rem.n; k++) {
			const struct vps_box *cut;
			if (k < h.n) {
				if (h.v[k].base >= rank)
					continue;
				cut = &h.v[k].region.box;
			} else {
				const struct vps_lost_range *x = &lost->ranges[k - h.n];
				if (x->tensor != R->tensor || x->state != R->state)
					continue;
				cut = &x->box;
			}
			VPS_CHECK_GOTO(vps_boxes_subtract(&rem, &scratch, cut), rc, done);
		}
		for (size_t j = 0; j < rem.n; j++) {
			struct vps_region part;
			vps_region_restrict(R, &rem.v[j], &part);
			if (!where || where[R->buffer] != VPS_WHERE_CUDA) {
				sum += vps_digest_region(buffers[R->buffer], &part, &t);
				continue;
			}
			if (!gpu) {
				rc = vps_fail(VPS_EINTERNAL, "a digest of GPU memory without the GPU's support loaded");
				goto done;
			}
			VPS_CHECK_GOTO(VPS_GROW(views, cap, nviews + 1), rc, done);
			part_view(&part, &t, buffers[R->buffer], &views[nviews++]);
		}
	}
	if (nviews) {
		/* the sum is one of elements, whatever computes which part */
		char err[VPS_CUDA_ERR] = "";
		uint64_t on_gpu = 0;
		int g = gpu->digest(views, nviews, &on_gpu, err);
		if (g) {
			rc = vps_gpu_result(g, err, "digest kernel");
			goto done;
		}
		sum += on_gpu;
	}
	*digest = sum;
	rc = VPS_OK;
done:
	free(views);
	vps_boxes_release(&rem);
	vps_boxes_release(&scratch);
	vps_holders_release(&h);
	vps_rank_view_release(&v);
	return rc;
}
