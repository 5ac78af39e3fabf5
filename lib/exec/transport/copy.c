/* Copies within this process's memory, a service the executor's retains
 * (a rank's own bytes, source buffer to target buffer) and ipc's pulls
 * from a peer's mapped buffer share; and the check, made before a byte
 * moves, that an op's views lie inside their buffers. */
#include <inttypes.h>

#include "gpu/gpu.h"
#include "util/internal.h"
#include "exec/transport/transport.h"
#include "vps/data.h"

/* The last byte a view touches, +1, or -1 when it cannot be real. */
static int64_t view_end(int64_t offset, const int64_t *strides, const struct vps_op *op)
{
	if (offset < 0 || op->ndim < 1 || op->ndim > VPS_MAX_DIMS || (op->esize != 2 && op->esize != 4))
		return -1;
	int64_t last = offset;
	for (int k = 0; k < op->ndim; k++) {
		int64_t t;
		if (op->ext[k] < 1 || strides[k] < 0 || (strides[k] == 0 && op->ext[k] > 1) ||
		    __builtin_mul_overflow(op->ext[k] - 1, strides[k], &t) || __builtin_add_overflow(last, t, &last))
			return -1;
	}
	int64_t end;
	if (__builtin_add_overflow(last, 1, &end) || __builtin_mul_overflow(end, (int64_t)op->esize, &end))
		return -1;
	return end;
}

vps_result_t vps_check_op(const struct vps_op *op, const int64_t *src_bytes, size_t nsrc, const int64_t *dst_bytes,
			  size_t ndst)
{
	if (src_bytes) {
		int64_t end = view_end(op->src_offset, op->src_strides, op);
		if (op->src_buffer >= nsrc || end < 0 || end > src_bytes[op->src_buffer])
			return vps_fail(VPS_EINPUT, "piece %" PRId64 ": its source view lies outside source buffer %u",
					op->piece, op->src_buffer);
	}
	if (dst_bytes) {
		int64_t end = view_end(op->dst_offset, op->dst_strides, op);
		if (op->dst_buffer >= ndst || end < 0 || end > dst_bytes[op->dst_buffer])
			return vps_fail(VPS_EINPUT, "piece %" PRId64 ": its destination view lies outside target buffer %u",
					op->piece, op->dst_buffer);
	}
	return VPS_OK;
}

vps_result_t vps_copy_where(const struct vps_op *op, int src_where, int dst_where, int *where)
{
	if (src_where != dst_where)
		return vps_fail(VPS_EINPUT, "piece %" PRId64 ": its source is %s memory, its target %s memory; vps-exec "
				"copies within one kind (offloaded state must be host memory in both layouts)",
				op->piece, src_where == VPS_WHERE_CUDA ? "GPU" : "host",
				dst_where == VPS_WHERE_CUDA ? "GPU" : "host");
	*where = src_where;
	return VPS_OK;
}

vps_result_t vps_copy_ops(const struct vps_switch *sw, const struct vps_local_copy *c, size_t n)
{
	size_t nk = 0;
	for (size_t i = 0; i < n; i++) {
		const struct vps_op *op = c[i].op;
		if (c[i].where == VPS_WHERE_CUDA) {
			nk++;
			continue;
		}
		vps_copy_strided((unsigned char *)c[i].dst + op->dst_offset * op->esize, op->dst_strides,
				 (const unsigned char *)c[i].src + op->src_offset * op->esize, op->src_strides, op->ext,
				 op->ndim, op->esize);
	}
	if (!nk)
		return VPS_OK;
	if (!sw->gpu)
		return vps_fail(VPS_EINTERNAL, "a GPU copy without the GPU's support loaded");
	struct vps_cuda_copy *k = vps_calloc(nk, sizeof(*k));
	if (!k)
		return VPS_ENOMEM;
	nk = 0;
	for (size_t i = 0; i < n; i++) {
		const struct vps_op *op = c[i].op;
		if (c[i].where != VPS_WHERE_CUDA)
			continue;
		struct vps_cuda_copy *kk = &k[nk++];
		kk->src = (uint64_t)(uintptr_t)c[i].src + (uint64_t)op->src_offset * op->esize;
		kk->dst = (uint64_t)(uintptr_t)c[i].dst + (uint64_t)op->dst_offset * op->esize;
		kk->ndim = op->ndim;
		kk->esize = op->esize;
		for (int d = 0; d < op->ndim; d++) {
			kk->ext[d] = op->ext[d];
			kk->src_strides[d] = op->src_strides[d];
			kk->dst_strides[d] = op->dst_strides[d];
		}
	}
	char err[VPS_CUDA_ERR] = "";
	int rc = sw->gpu->copy(k, nk, err);
	free(k);
	if (!rc)
		rc = sw->gpu->sync(NULL, sw->timeout, err);
	return rc ? vps_gpu_result(rc, err, "GPU copy") : VPS_OK;
}
