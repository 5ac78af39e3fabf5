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
	(void)op;
	if (src_where == dst_where)
		*where = src_where;
	else
		*where = src_where == VPS_WHERE_CUDA ? VPS_COPY_TO_HOST : VPS_COPY_TO_GPU;
	return VPS_OK;
}

static void contiguous_strides(const struct vps_op *op, int64_t *strides)
{
	int64_t s = 1;
	for (int d = op->ndim - 1; d >= 0; d--) {
		strides[d] = s;
		s *= op->ext[d];
	}
}

static void kernel_copy(struct vps_cuda_copy *k, const struct vps_op *op, uint64_t src, const int64_t *src_strides,
			uint64_t dst, const int64_t *dst_strides)
{
	k->src = src;
	k->dst = dst;
	k->ndim = op->ndim;
	k->esize = op->esize;
	for (int d = 0; d < op->ndim; d++) {
		k->ext[d] = op->ext[d];
		k->src_strides[d] = src_strides[d];
		k->dst_strides[d] = dst_strides[d];
	}
}

/* Copies between host and GPU memory (an offloaded optimizer's host part
 * meeting another rank's GPU part) go through two staging buffers, one on
 * each side, packed contiguous: host views packed on the host and sent
 * down, GPU views packed by the kernel and brought up, so that every
 * strided view is copied where its memory is. */
struct staging {
	unsigned char *host;
	void *gpu;
	size_t to_gpu, to_host; /* bytes of each direction; to_gpu's come first */
};

static vps_result_t staging_alloc(const struct vps_switch *sw, struct staging *st)
{
	size_t total = st->to_gpu + st->to_host;
	char err[VPS_CUDA_ERR] = "";
	st->host = vps_malloc(total);
	if (!st->host)
		return VPS_ENOMEM;
	int rc = sw->gpu->alloc(&st->gpu, total, err);
	if (rc) {
		st->gpu = NULL;
		return vps_gpu_result(rc, err, "GPU staging of copies between host and GPU memory");
	}
	return VPS_OK;
}

static void staging_release(const struct vps_switch *sw, struct staging *st)
{
	char err[VPS_CUDA_ERR] = "";
	if (st->gpu)
		(void)sw->gpu->release(st->gpu, err);
	free(st->host);
}

vps_result_t vps_copy_ops(const struct vps_switch *sw, const struct vps_local_copy *c, size_t n)
{
	size_t nk = 0;
	struct staging st = {0};
	for (size_t i = 0; i < n; i++) {
		const struct vps_op *op = c[i].op;
		if (c[i].where == VPS_WHERE_HOST) {
			vps_copy_strided((unsigned char *)c[i].dst + op->dst_offset * op->esize, op->dst_strides,
					 (const unsigned char *)c[i].src + op->src_offset * op->esize, op->src_strides,
					 op->ext, op->ndim, op->esize);
			continue;
		}
		nk++;
		if (c[i].where == VPS_COPY_TO_GPU)
			st.to_gpu += (size_t)vps_op_bytes(op);
		else if (c[i].where == VPS_COPY_TO_HOST)
			st.to_host += (size_t)vps_op_bytes(op);
	}
	if (!nk)
		return VPS_OK;
	if (!sw->gpu)
		return vps_fail(VPS_EINTERNAL, "a GPU copy without the GPU's support loaded");
	struct vps_cuda_copy *k = vps_calloc(nk, sizeof(*k));
	if (!k)
		return VPS_ENOMEM;
	char err[VPS_CUDA_ERR] = "";
	vps_result_t rc = VPS_OK;
	int grc = 0;
	if (st.to_gpu + st.to_host)
		rc = staging_alloc(sw, &st);
	/* the host views of copies to the GPU, packed and sent down */
	size_t at = 0;
	int64_t packed[VPS_MAX_DIMS];
	for (size_t i = 0; i < n && !rc; i++) {
		const struct vps_op *op = c[i].op;
		if (c[i].where != VPS_COPY_TO_GPU)
			continue;
		contiguous_strides(op, packed);
		vps_copy_strided(st.host + at, packed, (const unsigned char *)c[i].src + op->src_offset * op->esize,
				 op->src_strides, op->ext, op->ndim, op->esize);
		at += (size_t)vps_op_bytes(op);
	}
	if (!rc && st.to_gpu && (grc = sw->gpu->to_device(st.gpu, st.host, st.to_gpu, err)))
		rc = vps_gpu_result(grc, err, "copy to the GPU");
	size_t down = 0, up = st.to_gpu;
	nk = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		const struct vps_op *op = c[i].op;
		uint64_t src = (uint64_t)(uintptr_t)c[i].src + (uint64_t)op->src_offset * op->esize;
		uint64_t dst = (uint64_t)(uintptr_t)c[i].dst + (uint64_t)op->dst_offset * op->esize;
		uint64_t stage = (uint64_t)(uintptr_t)st.gpu;
		contiguous_strides(op, packed);
		if (c[i].where == VPS_WHERE_CUDA) {
			kernel_copy(&k[nk++], op, src, op->src_strides, dst, op->dst_strides);
		} else if (c[i].where == VPS_COPY_TO_GPU) {
			kernel_copy(&k[nk++], op, stage + down, packed, dst, op->dst_strides);
			down += (size_t)vps_op_bytes(op);
		} else if (c[i].where == VPS_COPY_TO_HOST) {
			kernel_copy(&k[nk++], op, src, op->src_strides, stage + up, packed);
			up += (size_t)vps_op_bytes(op);
		}
	}
	if (!rc && (grc = sw->gpu->copy(k, nk, err)))
		rc = vps_gpu_result(grc, err, "GPU copy");
	if (!rc && (grc = sw->gpu->sync(NULL, sw->timeout, err)))
		rc = vps_gpu_result(grc, err, "GPU copy");
	/* the GPU views of copies to the host, packed by the kernel, brought up */
	if (!rc && st.to_host &&
	    (grc = sw->gpu->to_host(st.host + st.to_gpu, (unsigned char *)st.gpu + st.to_gpu, st.to_host, err)))
		rc = vps_gpu_result(grc, err, "copy to the host");
	at = st.to_gpu;
	for (size_t i = 0; i < n && !rc && st.to_host; i++) {
		const struct vps_op *op = c[i].op;
		if (c[i].where != VPS_COPY_TO_HOST)
			continue;
		contiguous_strides(op, packed);
		vps_copy_strided((unsigned char *)c[i].dst + op->dst_offset * op->esize, op->dst_strides, st.host + at,
				 packed, op->ext, op->ndim, op->esize);
		at += (size_t)vps_op_bytes(op);
	}
	if (st.to_gpu + st.to_host)
		staging_release(sw, &st);
	free(k);
	return rc;
}
