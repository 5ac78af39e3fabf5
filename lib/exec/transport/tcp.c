/* The tcp transport: host memory over the rendezvous sockets.
 *
 * The wire stream of a transfer is its ops' bytes in order, each op's in
 * row-major order of its extents. The sender gathers them with sendmsg
 * straight from its source rows and the receiver scatters them with recvmsg
 * straight into its destination rows (iovecs over the views); an op strided
 * on its innermost axis goes through a bounce buffer, and so does a view in
 * GPU memory (a registry of both kinds: an offloaded optimizer's), packed
 * there and unpacked from it where it lies (vps_copy_ops). */
#include <inttypes.h>
#include <stdio.h>

#include "util/internal.h"
#include "exec/transport/transport.h"
#include "vps/data.h"

struct iovs {
	struct iovec *v;
	size_t n, cap;
};

static vps_result_t iov_push(struct iovs *v, void *base, size_t len)
{
	if (!len)
		return VPS_OK;
	if (v->n && (unsigned char *)v->v[v->n - 1].iov_base + v->v[v->n - 1].iov_len == base) {
		v->v[v->n - 1].iov_len += len;
		return VPS_OK;
	}
	VPS_CHECK(VPS_GROW(v->v, v->cap, v->n + 1));
	v->v[v->n].iov_base = base;
	v->v[v->n].iov_len = len;
	v->n++;
	return VPS_OK;
}

static bool strided_inner(const struct vps_op *op, const int64_t *strides)
{
	return strides[op->ndim - 1] != 1 && op->ext[op->ndim - 1] != 1;
}

/* One iovec per row of the view, merged where rows touch. */
static vps_result_t view_rows(unsigned char *buf, int64_t offset, const int64_t *strides, const struct vps_op *op,
			      struct iovs *out)
{
	int last = op->ndim - 1;
	int64_t rows = 1, idx[VPS_MAX_DIMS] = {0};
	for (int k = 0; k < last; k++)
		rows *= op->ext[k];
	size_t len = (size_t)op->ext[last] * op->esize;
	for (int64_t r = 0; r < rows; r++) {
		int64_t off = offset;
		for (int k = 0; k < last; k++)
			off += idx[k] * strides[k];
		VPS_CHECK(iov_push(out, buf + off * op->esize, len));
		for (int k = last - 1; k >= 0; k--) {
			if (++idx[k] < op->ext[k])
				break;
			idx[k] = 0;
		}
	}
	return VPS_OK;
}

/* Whether op's view on this side of the transfer is in GPU memory. */
static bool on_gpu(const struct vps_switch *sw, const struct vps_op *op, bool sending)
{
	if (sw->where != VPS_WHERE_MIXED)
		return false;
	/* a target buffer, a source, or the transit area (vps_switch_dst_where) */
	return (sending ? vps_switch_src_where(sw, op->src_buffer) : vps_switch_dst_where(sw, op->dst_buffer)) ==
	       VPS_WHERE_CUDA;
}

static bool bounced(const struct vps_switch *sw, const struct vps_op *op, bool sending)
{
	return on_gpu(sw, op, sending) || strided_inner(op, sending ? op->src_strides : op->dst_strides);
}

/* The bounce buffer's side of a GPU view's copy: op with its other view
 * contiguous (the bounce's, at offset 0). */
static struct vps_op packed_op(const struct vps_op *op, bool sending)
{
	struct vps_op p = *op;
	int64_t flat[VPS_MAX_DIMS];
	vps_rowmajor_strides(op->ext, op->ndim, flat);
	memcpy(sending ? p.dst_strides : p.src_strides, flat, sizeof(flat));
	*(sending ? &p.dst_offset : &p.src_offset) = 0;
	return p;
}

/* The copies between a transfer's GPU views and its bounce buffer, in one
 * go: packs before a send (to the host), unpacks after a receive. */
static vps_result_t gpu_bounce(const struct vps_switch *sw, const struct vps_xfer *x, bool sending,
			       unsigned char *bounce)
{
	const struct vps_staged *s = sw->s;
	size_t n = 0, at = 0;
	for (size_t q = 0; q < x->nops; q++)
		n += on_gpu(sw, &s->ops[x->first_op + q], sending);
	if (!n)
		return VPS_OK;
	struct vps_op *ops = vps_malloc(n * sizeof(*ops));
	struct vps_local_copy *c = vps_malloc(n * sizeof(*c));
	if (!ops || !c) {
		free(ops);
		free(c);
		return VPS_ENOMEM;
	}
	n = 0;
	for (size_t q = 0; q < x->nops; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		if (!bounced(sw, op, sending))
			continue;
		if (on_gpu(sw, op, sending)) {
			ops[n] = packed_op(op, sending);
			void *buf = sending ? vps_switch_src(sw, op->src_buffer) : vps_switch_dst(sw, op->dst_buffer);
			c[n] = sending ? (struct vps_local_copy){&ops[n], buf, bounce + at, VPS_COPY_TO_HOST}
				       : (struct vps_local_copy){&ops[n], bounce + at, buf, VPS_COPY_TO_GPU};
			n++;
		}
		at += (size_t)vps_op_bytes(op);
	}
	vps_result_t rc = vps_copy_ops(sw, c, n);
	free(ops);
	free(c);
	return rc;
}

static vps_result_t transfer_iovs(const struct vps_switch *sw, const struct vps_xfer *x, bool sending,
				  struct iovs *out, unsigned char **bounce)
{
	const struct vps_staged *s = sw->s;
	size_t need = 0;
	for (size_t q = 0; q < x->nops; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		if (bounced(sw, op, sending))
			need += (size_t)vps_op_bytes(op);
	}
	*bounce = NULL;
	if (need && !(*bounce = malloc(need)))
		return VPS_NOMEM();
	size_t at = 0;
	for (size_t q = 0; q < x->nops; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		/* a relay passes on from its target buffers (or its transit
		 * area) what it received */
		unsigned char *buf = sending ? vps_switch_src(sw, op->src_buffer) : vps_switch_dst(sw, op->dst_buffer);
		int64_t off = sending ? op->src_offset : op->dst_offset;
		const int64_t *st = sending ? op->src_strides : op->dst_strides;
		if (!bounced(sw, op, sending)) {
			VPS_CHECK(view_rows(buf, off, st, op, out));
			continue;
		}
		int64_t flat[VPS_MAX_DIMS];
		vps_rowmajor_strides(op->ext, op->ndim, flat);
		if (sending && !on_gpu(sw, op, sending))
			vps_copy_strided(*bounce + at, flat, buf + off * op->esize, st, op->ext, op->ndim, op->esize);
		VPS_CHECK(iov_push(out, *bounce + at, (size_t)vps_op_bytes(op)));
		at += (size_t)vps_op_bytes(op);
	}
	return sending ? gpu_bounce(sw, x, true, *bounce) : VPS_OK;
}

/* After a receive: ops that came through the bounce buffer go in place. */
static vps_result_t unbounce(const struct vps_switch *sw, const struct vps_xfer *x, unsigned char *bounce)
{
	const struct vps_staged *s = sw->s;
	size_t at = 0;
	for (size_t q = 0; q < x->nops && bounce; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		if (!bounced(sw, op, false))
			continue;
		if (!on_gpu(sw, op, false)) {
			int64_t flat[VPS_MAX_DIMS];
			vps_rowmajor_strides(op->ext, op->ndim, flat);
			vps_copy_strided((unsigned char *)vps_switch_dst(sw, op->dst_buffer) + op->dst_offset * op->esize,
					 op->dst_strides, bounce + at, flat, op->ext, op->ndim, op->esize);
		}
		at += (size_t)vps_op_bytes(op);
	}
	return bounce ? gpu_bounce(sw, x, false, bounce) : VPS_OK;
}

static uint64_t xfer_tag(const struct vps_xfer *x)
{
	return ((uint64_t)x->stage << 40) ^ ((uint64_t)x->step << 16) ^ (uint64_t)x->chunk;
}

static bool tcp_can_connect(const struct vps_peer_info *peer)
{
	(void)peer;
	return true;
}

static vps_result_t tcp_setup(void **self, const struct vps_transport_env *env)
{
	(void)env;
	*self = NULL;
	return VPS_OK;
}

static vps_result_t tcp_begin(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n)
{
	(void)self;
	(void)x;
	(void)n;
	/* a registry of both kinds (an offloaded optimizer's) moves its GPU
	 * views through host bounce buffers */
	if (sw->where != VPS_WHERE_HOST && sw->where != VPS_WHERE_MIXED)
		return vps_fail(VPS_EINPUT, "the tcp transport moves host memory; the trainer registered GPU memory "
					    "(use --transport ipc, nccl or auto)");
	return VPS_OK;
}

static vps_result_t tcp_stage(void *self, struct vps_switch *sw, const struct vps_xfer *const *mine, size_t nx,
			      const char *what)
{
	(void)self;
	vps_result_t rc = VPS_OK;
	struct vps_net_msg *msgs = vps_calloc(nx + 1, sizeof(*msgs));
	struct iovs *iov = vps_calloc(nx + 1, sizeof(*iov));
	unsigned char **bounce = vps_calloc(nx + 1, sizeof(*bounce));
	size_t nm = 0;
	if (!msgs || !iov || !bounce) {
		rc = VPS_ENOMEM;
		goto done;
	}
	for (size_t k = 0; k < nx && !rc; k++) {
		const struct vps_xfer *x = mine[k];
		bool sending = x->src == sw->w;
		rc = transfer_iovs(sw, x, sending, &iov[k], &bounce[k]);
		int64_t peer = vps_switch_peer(sw, x)->rank;
		size_t m = 0;
		while (m < nm && msgs[m].peer != peer)
			m++;
		if (m == nm) {
			msgs[nm].peer = peer;
			msgs[nm].tag = xfer_tag(x);
			nm++;
		}
		if (sending ? msgs[m].send : msgs[m].recv) {
			/* a stage pairs a rank with a peer once per direction */
			rc = vps_fail(VPS_EINPUT, "%s: two transfers %s rank %" PRId64 " in one stage", what,
				      sending ? "to" : "from", peer);
			break;
		}
		if (sending) {
			msgs[m].send = true;
			msgs[m].send_iov = iov[k].v;
			msgs[m].send_iovcnt = iov[k].n;
		} else {
			msgs[m].recv = true;
			msgs[m].recv_iov = iov[k].v;
			msgs[m].recv_iovcnt = iov[k].n;
		}
	}
	if (!rc && nm)
		rc = vps_net_exchange(sw->net, msgs, nm, what);
	for (size_t k = 0; k < nx && !rc; k++)
		if (mine[k]->dst == sw->w)
			rc = unbounce(sw, mine[k], bounce[k]);
done:
	for (size_t k = 0; k < nx && iov && bounce; k++) {
		free(bounce[k]);
		free(iov[k].v);
	}
	free(msgs);
	free(iov);
	free(bounce);
	return rc;
}

static void tcp_free(void *self) { (void)self; }

const struct vps_transport vps_transport_tcp = {
	.name = "tcp",
	.can_connect = tcp_can_connect,
	.setup = tcp_setup,
	.begin = tcp_begin,
	.stage = tcp_stage,
	.free = tcp_free,
};
