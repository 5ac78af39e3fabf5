/* The nccl transport: GPU memory between GPUs of any nodes.
 *
 * Per stage, one gather kernel packs this rank's outgoing transfers into
 * the staging buffer (each op at the 256-byte offset the staged plan gives
 * it), one NCCL group sends and receives every transfer of the stage, and
 * one scatter kernel unpacks the incoming ones into the destination views;
 * all three are queued on one stream and waited for under the timeout (a
 * peer that stops makes the communicator abort). The staging buffer is
 * allocated once, at the largest stage of this rank, which the budget
 * bounds. The communicator is made once per executor, with the unique id
 * sent over the rendezvous, before the trainer asks for a switch. */
#include <inttypes.h>
#include <stdio.h>

#include "gpu/gpu.h"
#include "util/internal.h"
#include "exec/transport/transport.h"
#include "vps/data.h"

struct nccl {
	const struct vps_cuda_api *gpu;
	void *comm;
	int64_t rank;
	void *staging;
	size_t cap;
	struct vps_cuda_copy *gather, *scatter;
	size_t capg, caps;
	struct vps_cuda_p2p *p2p;
	size_t capp;
};

static bool nccl_can_connect(const struct vps_peer_info *peer)
{
	(void)peer;
	return true;
}

static vps_result_t nccl_begin(void *self, struct vps_switch *sw, const struct vps_xfer *const *mine, size_t n)
{
	struct nccl *t = self;
	if (sw->where == VPS_WHERE_MIXED)
		return vps_fail(VPS_EINPUT, "the nccl transport moves GPU memory; the trainer registered host and GPU "
					    "memory, which --transport ipc (one node) and tcp move in one switch");
	if (sw->where != VPS_WHERE_CUDA)
		return vps_fail(VPS_EINPUT, "the nccl transport moves GPU memory; the trainer registered host memory "
					    "(use --transport tcp or ipc)");
	/* the largest stage of this rank's transfers over NCCL */
	const struct vps_staged *s = sw->s;
	size_t need = 0, cur = 0;
	int64_t stage = -1;
	for (size_t i = 0; i < n; i++) {
		const struct vps_xfer *x = mine[i];
		if (x->stage != stage)
			cur = 0;
		stage = x->stage;
		if (x->bytes < 0 || (uint64_t)x->bytes > SIZE_MAX / 2)
			return vps_fail(VPS_EINPUT, "transfer of stage %" PRId64 " claims %" PRId64 " bytes", x->stage, x->bytes);
		cur += (size_t)vps_round_up(x->bytes, VPS_STAGE_ALIGN);
		if (cur > need)
			need = cur;
		for (size_t q = 0; q < x->nops; q++) {
			const struct vps_op *op = &s->ops[x->first_op + q];
			if (op->staging < 0 || op->staging > x->bytes || vps_op_bytes(op) > x->bytes - op->staging)
				return vps_fail(VPS_EINPUT, "piece %" PRId64 ": its staging offset lies outside its transfer",
						op->piece);
		}
	}
	if (need > t->cap) {
		char err[VPS_CUDA_ERR];
		if (t->staging)
			t->gpu->release(t->staging, err);
		t->staging = NULL;
		t->cap = 0;
		VPS_GPU(t->gpu->alloc(&t->staging, need, err), "allocate the staging buffer");
		t->cap = need;
	}
	return VPS_OK;
}

static vps_result_t push_copy(struct vps_cuda_copy **v, size_t *cap, size_t n, const struct vps_op *op, uint64_t src,
			      const int64_t *sst, uint64_t dst, const int64_t *dst_st)
{
	VPS_CHECK(vps_grow((void **)v, cap, n + 1, sizeof(**v)));
	struct vps_cuda_copy *c = &(*v)[n];
	memset(c, 0, sizeof(*c));
	c->src = src;
	c->dst = dst;
	c->ndim = op->ndim;
	c->esize = op->esize;
	for (int k = 0; k < op->ndim; k++) {
		c->ext[k] = op->ext[k];
		c->src_strides[k] = sst[k];
		c->dst_strides[k] = dst_st[k];
	}
	return VPS_OK;
}

/* "rank 1" or "ranks 1, 3": the peers of a stage's group. NCCL does not
 * say which peer a stalled group waits for; one of these. */
static void group_peers(const struct vps_cuda_p2p *p, size_t n, char *out, size_t len)
{
	char list[128] = "";
	size_t at = 0, count = 0;
	for (size_t k = 0; k < n; k++) {
		size_t j = 0;
		while (j < k && p[j].peer != p[k].peer)
			j++;
		if (j < k)
			continue;
		if (at + 16 >= sizeof(list)) {
			snprintf(list + at, sizeof(list) - at, ", ...");
			break;
		}
		at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d", count++ ? ", " : "", p[k].peer);
	}
	snprintf(out, len, "rank%s %s", count > 1 ? "s" : "", list);
}

static vps_result_t nccl_stage(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n,
			       const char *what)
{
	struct nccl *t = self;
	const struct vps_staged *s = sw->s;
	size_t ng = 0, ns = 0, at = 0;
	VPS_CHECK(vps_grow((void **)&t->p2p, &t->capp, n + 1, sizeof(*t->p2p)));
	for (size_t k = 0; k < n; k++) {
		bool sending = x[k]->src == sw->w;
		uint64_t base = (uint64_t)(uintptr_t)t->staging + at;
		/* nccl_begin sized the buffer for these transfers */
		if (at + (size_t)x[k]->bytes > t->cap)
			return vps_fail(VPS_EINTERNAL, "%s: this rank's transfers outgrow its staging buffer", what);
		t->p2p[k] = (struct vps_cuda_p2p){base, (uint64_t)x[k]->bytes, (int32_t)vps_switch_peer(sw, x[k])->rank,
						  sending ? 1 : 0};
		for (size_t q = 0; q < x[k]->nops; q++) {
			const struct vps_op *op = &s->ops[x[k]->first_op + q];
			int64_t flat[VPS_MAX_DIMS];
			vps_rowmajor_strides(op->ext, op->ndim, flat);
			uint64_t staged = base + (uint64_t)op->staging;
			if (sending) {
				/* a relay passes on from its target buffers, or its transit
				 * area, what an earlier stage's scatter put there (every
				 * stage ends synchronized); a joining relay has no sources */
				void *from = vps_switch_src(sw, op->src_buffer);
				VPS_CHECK(push_copy(&t->gather, &t->capg, ng++, op,
						    (uint64_t)(uintptr_t)from + (uint64_t)op->src_offset * op->esize,
						    op->src_strides, staged, flat));
			} else
				VPS_CHECK(push_copy(&t->scatter, &t->caps, ns++, op, staged, flat,
						    (uint64_t)(uintptr_t)vps_switch_dst(sw, op->dst_buffer) +
							    (uint64_t)op->dst_offset * op->esize,
						    op->dst_strides));
		}
		at += (size_t)vps_round_up(x[k]->bytes, VPS_STAGE_ALIGN);
	}
	char err[VPS_CUDA_ERR] = "";
	int rc = t->gpu->copy(t->gather, ng, err);
	if (!rc)
		rc = t->gpu->nccl_exchange(t->comm, t->p2p, n, err);
	if (!rc)
		rc = t->gpu->copy(t->scatter, ns, err);
	if (rc)
		return vps_gpu_result(rc, err, what);
	rc = t->gpu->sync(t->comm, sw->timeout, err);
	if (rc) {
		/* the wait aborted the communicator, which frees it, on a timeout
		 * and on NCCL's asynchronous error alike */
		if (rc == VPS_CUDA_ETIMEOUT || rc == VPS_CUDA_ENCCL)
			t->comm = NULL;
		char peers[160], w[256];
		group_peers(t->p2p, n, peers, sizeof(peers));
		snprintf(w, sizeof(w), "%s (NCCL group with %s)", what, peers);
		return vps_gpu_result(rc, err, w);
	}
	return VPS_OK;
}

static void nccl_free(void *self)
{
	struct nccl *t = self;
	if (!t)
		return;
	char err[VPS_CUDA_ERR];
	if (t->staging)
		t->gpu->release(t->staging, err);
	if (t->comm)
		t->gpu->nccl_free(t->comm, err);
	free(t->gather);
	free(t->scatter);
	free(t->p2p);
	free(t);
}

/* The communicator, over the rendezvous: every rank says whether it can go
 * on, so that a rank without a GPU or NCCL stops them all at once, by name;
 * then rank 0's unique id reaches every rank. */
static vps_result_t nccl_setup(void **out, const struct vps_transport_env *env)
{
	const struct vps_cuda_api *gpu = NULL;
	unsigned char id[VPS_CUDA_NCCL_ID] = {0};
	char err[VPS_CUDA_ERR] = "";
	vps_result_t rc = vps_gpu_init(env->device, env->local_rank, &gpu);
	if (!rc && !gpu->has_nccl)
		rc = vps_fail(VPS_EUNSUPPORTED, "libvps-cuda.so was built without NCCL (nccl.h was not found)");
	if (!rc && env->world > INT32_MAX)
		rc = vps_fail(VPS_EINPUT, "a world of %" PRId64 " ranks is beyond NCCL", env->world);
	if (!rc && env->rank == 0) {
		int g = gpu->nccl_id(id, err);
		if (g)
			rc = vps_gpu_result(g, err, "NCCL unique id");
	}
	VPS_CHECK(vps_net_agree_result(env->net, rc, "NCCL setup"));
	VPS_CHECK(vps_net_broadcast(env->net, id, sizeof(id), "NCCL unique id"));
	struct nccl *self = vps_calloc(1, sizeof(*self));
	if (!self)
		return VPS_ENOMEM;
	self->gpu = gpu;
	self->rank = env->rank;
	int g = gpu->nccl_init(&self->comm, (int)env->world, (int)env->rank, id, err);
	if (g) {
		free(self);
		return vps_gpu_result(g, err, "NCCL communicator");
	}
	*out = self;
	return VPS_OK;
}

const struct vps_transport vps_transport_nccl = {
	.name = "nccl",
	.can_connect = nccl_can_connect,
	.setup = nccl_setup,
	.begin = nccl_begin,
	.stage = nccl_stage,
	.free = nccl_free,
};
