/* The ipc transport: ranks of one node map each other's registered buffers.
 *
 * Pull: before the start, every rank sends the descriptors of its source
 * buffers (a shared-memory object name, or a CUDA IPC handle, with offset
 * and size) to the ranks it sends to, over the rendezvous sockets. The
 * receiver maps them (read-only for host memory) and, per stage, copies
 * source rows straight into destination rows: one copy per byte, no staging
 * buffer, one kernel per stage on a GPU. A zero-byte handshake with each of
 * the stage's peers then tells a sender that its receivers are done with
 * what it sends (so it may release a source early) and names a peer that
 * died. Sources are never written: host sources are mapped read-only.
 *
 * Relays: a rank that passes pieces on (a plan made with --relay) also
 * describes its target buffers, flagged VPS_BUFFER_TARGET, after its
 * sources, and its receivers map them read-only. A forward lies in a stage
 * after the one that filled the relay's target, but the receiver copies,
 * not the relay: before it reads, the relay says it has reached the
 * forward's stage (every copy of its earlier stages done and, on a GPU,
 * synchronized), a zero-byte message like the one after.
 *
 * Transit: a rank that passes on from its transit area describes it last,
 * flagged VPS_BUFFER_TRANSIT | VPS_BUFFER_TARGET, and its receivers map it
 * read-only as they map a relay's targets (a shared-memory object of this
 * user, mode 0600, or a CUDA IPC handle) and read it after the same
 * message. A receiver closes a GPU area before it says it is done with the
 * last stage reading it, so that the area's owner, which frees it at the
 * end of the switch, never frees memory a node-mate has open (undefined in
 * CUDA).
 *
 * Prepare: the same exchange before the request, once every trainer has
 * registered its sources, so that the receivers map the peers' host
 * objects and open their CUDA IPC handles while the trainers still train
 * (ms each on a GPU); begin's exchange then finds them open. */
#include <inttypes.h>
#include <stdio.h>

#include "util/internal.h"
#include "exec/transport/transport.h"

#define IPC_MAX_BUFFERS 4096

struct ipc_peer {
	int64_t peer;           /* its net rank */
	uint64_t count;         /* its buffers described: sources, then targets it forwards from */
	uint64_t nsources;
	uint64_t area;          /* the index of its transit area's descriptor, or UINT64_MAX */
	int64_t area_last;      /* the last stage reading its area (-1: none) */
	struct vps_buffer_desc *desc;
	int64_t *bytes;
	void **ptr;
};

struct ipc {
	struct ipc_peer *peers; /* the ranks this rank pulls from in this switch */
	size_t npeers, cap;
	struct vps_local_copy *copies;
	size_t capc;
};

static bool ipc_can_connect(const struct vps_peer_info *peer) { return peer->same_node; }

static vps_result_t ipc_setup(void **self, const struct vps_transport_env *env)
{
	(void)env;
	*self = vps_calloc(1, sizeof(struct ipc));
	return *self ? VPS_OK : VPS_ENOMEM;
}

static struct ipc_peer *find(struct ipc *t, int64_t peer)
{
	for (size_t i = 0; i < t->npeers; i++)
		if (t->peers[i].peer == peer)
			return &t->peers[i];
	return NULL;
}

static void forget_peers(struct ipc *t)
{
	for (size_t i = 0; i < t->npeers; i++) {
		free(t->peers[i].desc);
		free(t->peers[i].bytes);
		free(t->peers[i].ptr);
	}
	t->npeers = 0;
}

static bool forwards(const struct vps_staged *s, const struct vps_xfer *x)
{
	return x->nops && (s->ops[x->first_op].src_buffer & VPS_BUFFER_TARGET);
}

/* Whether a transfer forwards from its sender's transit area (any op), and
 * from its target buffers (any op). */
static void forwards_from(const struct vps_staged *s, const struct vps_xfer *x, bool *area, bool *targets)
{
	for (size_t q = 0; q < x->nops; q++) {
		uint32_t b = s->ops[x->first_op + q].src_buffer;
		if (!(b & VPS_BUFFER_TARGET))
			continue;
		if (vps_buffer_index(b) == VPS_BUFFER_TRANSIT)
			*area = true;
		else
			*targets = true;
	}
}

/* The index of an op's source among its sender's descriptors. */
static uint32_t desc_index(const struct ipc_peer *p, uint32_t src_buffer)
{
	if (!(src_buffer & VPS_BUFFER_TARGET))
		return src_buffer;
	if (vps_buffer_index(src_buffer) == VPS_BUFFER_TRANSIT)
		return p->area < p->count ? (uint32_t)p->area : UINT32_MAX;
	uint64_t i = p->nsources + vps_buffer_index(src_buffer);
	return i < p->count ? (uint32_t)i : UINT32_MAX;
}

/* This rank's source buffers as descriptors, its target buffers after
 * them when it forwards from them (targets: attached, sw->dst_entry), and
 * its transit area last when it forwards from that (area). */
static vps_result_t my_buffers(const struct vps_switch *sw, bool targets, bool area, struct vps_buffer_desc **out,
			       uint64_t *n)
{
	uint64_t nsrc = sw->ra >= 0 ? sw->va.nbuffers : 0, ndst = targets && sw->dst_entry ? sw->vb.nbuffers : 0;
	area = area && sw->transit_desc;
	*out = vps_calloc(nsrc + ndst + 2, sizeof(**out));
	if (!*out)
		return VPS_ENOMEM;
	/* before the request, a trainer may not have registered them all */
	for (uint64_t b = 0; b < nsrc; b++)
		if (sw->src_entry[b] < 0)
			nsrc = 0;
	*n = nsrc + ndst + area;
	if (area)
		(*out)[nsrc + ndst] = *sw->transit_desc;
	for (uint64_t b = 0; b < nsrc + ndst; b++) {
		struct vps_registry_entry_info e;
		bool target = b >= nsrc;
		VPS_CHECK(vps_registry_entry(sw->reg, (uint32_t)(target ? sw->dst_entry[b - nsrc] : sw->src_entry[b]), &e));
		struct vps_buffer_desc *d = &(*out)[b];
		d->where = (uint32_t)e.where;
		d->buffer = target ? (uint32_t)(b - nsrc) | VPS_BUFFER_TARGET : (uint32_t)b;
		d->device = e.device;
		d->offset = e.offset;
		d->bytes = e.bytes;
		snprintf(d->shm_name, sizeof(d->shm_name), "%s", e.shm_name);
		memcpy(d->ipc, e.ipc_handle, sizeof(d->ipc));
	}
	return VPS_OK;
}

/* One message per peer of the switch, in the order the transfers name
 * them: whether this rank sends to it, receives from it, or both; and a
 * peer entry for each rank it receives from. */
static vps_result_t switch_peers(struct ipc *t, const struct vps_switch *sw, const struct vps_xfer *const *x, size_t n,
				 uint64_t tag, struct vps_net_msg **msgs, size_t *nm)
{
	size_t capm = 0;
	*msgs = NULL;
	*nm = 0;
	for (size_t i = 0; i < n; i++) {
		int64_t peer = vps_switch_peer(sw, x[i])->rank;
		size_t m = 0;
		while (m < *nm && (*msgs)[m].peer != peer)
			m++;
		if (m == *nm) {
			VPS_CHECK(VPS_GROW(*msgs, capm, *nm + 1));
			memset(&(*msgs)[m], 0, sizeof(**msgs));
			(*msgs)[m].peer = peer;
			(*msgs)[m].tag = tag;
			(*nm)++;
		}
		if (x[i]->src == sw->w)
			(*msgs)[m].send = true;
		else
			(*msgs)[m].recv = true;
	}
	VPS_CHECK(VPS_GROW(t->peers, t->cap, *nm + 1));
	for (size_t m = 0; m < *nm; m++) {
		if (!(*msgs)[m].recv)
			continue;
		struct ipc_peer *p = &t->peers[t->npeers++];
		memset(p, 0, sizeof(*p));
		p->peer = (*msgs)[m].peer;
		p->area = UINT64_MAX;
		p->area_last = -1;
	}
	return VPS_OK;
}

/* Each peer's descriptor count, then room for its descriptors. */
static vps_result_t exchange_counts(struct ipc *t, const struct vps_switch *sw, struct vps_net_msg *msgs, size_t nm,
				    struct iovec *iov, uint64_t *nmine)
{
	for (size_t m = 0; m < nm; m++) {
		struct ipc_peer *p = msgs[m].recv ? find(t, msgs[m].peer) : NULL;
		iov[2 * m] = (struct iovec){nmine, sizeof(*nmine)};
		iov[2 * m + 1] = (struct iovec){p ? (void *)&p->count : NULL, p ? sizeof(p->count) : 0};
		msgs[m].send_iov = &iov[2 * m];
		msgs[m].send_iovcnt = msgs[m].send ? 1 : 0;
		msgs[m].recv_iov = &iov[2 * m + 1];
		msgs[m].recv_iovcnt = p ? 1 : 0;
	}
	VPS_CHECK(vps_net_exchange(sw->net, msgs, nm, "ipc: buffer counts"));
	for (size_t i = 0; i < t->npeers; i++) {
		struct ipc_peer *p = &t->peers[i];
		if (p->count > IPC_MAX_BUFFERS)
			return vps_fail(VPS_EPEER, "ipc: rank %" PRId64 " announces %" PRIu64 " source buffers", p->peer,
					p->count);
		p->nsources = 0;
		p->desc = vps_calloc(p->count + 1, sizeof(*p->desc));
		p->bytes = vps_calloc(p->count + 1, sizeof(*p->bytes));
		p->ptr = vps_calloc(p->count + 1, sizeof(*p->ptr));
		if (!p->desc || !p->bytes || !p->ptr)
			return VPS_ENOMEM;
	}
	return VPS_OK;
}

static vps_result_t exchange_descriptors(struct ipc *t, const struct vps_switch *sw, struct vps_net_msg *msgs,
					 size_t nm, struct iovec *iov, const struct vps_buffer_desc *mine, uint64_t nmine,
					 uint64_t tag)
{
	for (size_t m = 0; m < nm; m++) {
		struct ipc_peer *p = msgs[m].recv ? find(t, msgs[m].peer) : NULL;
		iov[2 * m] = (struct iovec){(void *)mine, nmine * sizeof(*mine)};
		iov[2 * m + 1] = (struct iovec){p ? (void *)p->desc : NULL, p ? p->count * sizeof(*p->desc) : 0};
		msgs[m].tag = tag;
	}
	return vps_net_exchange(sw->net, msgs, nm, "ipc: buffer descriptors");
}

/* Map what each peer sends from. */
static vps_result_t map_peer_sources(struct ipc *t, const struct vps_switch *sw)
{
	for (size_t i = 0; i < t->npeers; i++) {
		struct ipc_peer *p = &t->peers[i];
		/* sources 0, 1, ..., then targets 0, 1, ..., then the transit area */
		while (p->nsources < p->count && !(p->desc[p->nsources].buffer & VPS_BUFFER_TARGET))
			p->nsources++;
		bool area = p->count && p->desc[p->count - 1].buffer == (VPS_BUFFER_TRANSIT | VPS_BUFFER_TARGET);
		p->area = area ? p->count - 1 : UINT64_MAX;
		for (uint64_t b = 0; b < p->count; b++) {
			struct vps_buffer_desc *d = &p->desc[b];
			uint32_t want = b == p->area	    ? VPS_BUFFER_TRANSIT | VPS_BUFFER_TARGET
					: b < p->nsources ? (uint32_t)b
							  : (uint32_t)(b - p->nsources) | VPS_BUFFER_TARGET;
			d->shm_name[sizeof(d->shm_name) - 1] = '\0';
			/* with host and GPU memory both, each copy checks its two ends */
			if ((sw->where != VPS_WHERE_MIXED && d->where != (uint32_t)sw->where) || d->buffer != want ||
			    d->bytes > INT64_MAX)
				return vps_fail(VPS_EPEER, "ipc: rank %" PRId64 "'s source buffer %" PRIu64 " is %s memory, this "
						"rank's buffers are %s", p->peer, b, d->where == VPS_WHERE_CUDA ? "GPU" : "host",
						sw->where == VPS_WHERE_CUDA ? "GPU" : "host");
			p->bytes[b] = (int64_t)d->bytes;
			vps_result_t rc = vps_mapcache_map(sw->maps, sw->gpu, d, false, false, false, &p->ptr[b]);
			if (rc) {
				vps_error_prefix("ipc: rank %" PRId64 "'s source buffer %" PRIu64, p->peer, b);
				return rc;
			}
		}
	}
	return VPS_OK;
}

/* The peers' source descriptors, to the ranks that read them, over the
 * rendezvous (tags: begin's or prepare's): t->peers then holds what each
 * peer this rank receives from sends from. With targets, a rank that
 * forwards describes its targets too. */
static vps_result_t exchange(struct ipc *t, const struct vps_switch *sw, const struct vps_xfer *const *x, size_t n,
			     uint64_t tag, bool targets)
{
	vps_result_t rc = VPS_OK;
	struct vps_net_msg *msgs = NULL;
	struct iovec *iov = NULL;
	struct vps_buffer_desc *mine = NULL;
	uint64_t nmine = 0;
	size_t nm = 0;
	forget_peers(t);
	VPS_CHECK_GOTO(switch_peers(t, sw, x, n, tag, &msgs, &nm), rc, done);
	if (!nm)
		goto done;
	bool from_targets = false, from_area = false;
	for (size_t i = 0; targets && i < n; i++)
		if (x[i]->src == sw->w)
			forwards_from(sw->s, x[i], &from_area, &from_targets);
	VPS_CHECK_GOTO(my_buffers(sw, from_targets, from_area, &mine, &nmine), rc, done);
	iov = vps_calloc(2 * nm + 1, sizeof(*iov));
	if (!iov) {
		rc = VPS_ENOMEM;
		goto done;
	}
	VPS_CHECK_GOTO(exchange_counts(t, sw, msgs, nm, iov, &nmine), rc, done);
	VPS_CHECK_GOTO(exchange_descriptors(t, sw, msgs, nm, iov, mine, nmine, tag + 1), rc, done);
done:
	free(mine);
	free(msgs);
	free(iov);
	return rc;
}

/* Pull: the receivers map what their peers send from, and the views this
 * rank will read must lie inside what it mapped. */
static vps_result_t ipc_begin(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n)
{
	struct ipc *t = self;
	const struct vps_staged *s = sw->s;
	VPS_CHECK(exchange(t, sw, x, n, 0x1bc0, true));
	VPS_CHECK(map_peer_sources(t, sw));
	for (size_t i = 0; i < n; i++) {
		if (x[i]->dst != sw->w)
			continue;
		struct ipc_peer *p = find(t, vps_switch_peer(sw, x[i])->rank);
		for (size_t q = 0; q < x[i]->nops && p; q++) {
			struct vps_op op = s->ops[x[i]->first_op + q];
			bool area = (op.src_buffer & VPS_BUFFER_TARGET) && vps_buffer_index(op.src_buffer) == VPS_BUFFER_TRANSIT;
			if (area && x[i]->stage > p->area_last)
				p->area_last = x[i]->stage;
			op.src_buffer = desc_index(p, op.src_buffer);
			VPS_CHECK(vps_check_op(&op, p->bytes, p->count, NULL, 0));
		}
	}
	return VPS_OK;
}

/* Before the request: the same descriptors, mapped (host memory) or opened
 * (GPU memory) now, kept by the mapping cache for begin. A descriptor that
 * does not map is left for begin, which names it. */
static vps_result_t ipc_prepare(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n)
{
	struct ipc *t = self;
	VPS_CHECK(exchange(t, sw, x, n, 0x1bd0, false));
	for (size_t i = 0; i < t->npeers; i++) {
		struct ipc_peer *p = &t->peers[i];
		for (uint64_t b = 0; b < p->count; b++) {
			struct vps_buffer_desc *d = &p->desc[b];
			d->shm_name[sizeof(d->shm_name) - 1] = '\0';
			if (d->where == VPS_WHERE_CUDA && !sw->gpu)
				continue;
			if (vps_mapcache_prefetch(sw->maps, sw->gpu, d, false, true))
				vps_clear_error();
		}
	}
	forget_peers(t);
	return VPS_OK;
}

/* Before a receiver reads a forward from its relay's target: the relay
 * has reached this stage, so the copies that filled it are done. */
static vps_result_t relays_ready(const struct vps_switch *sw, const struct vps_xfer *const *x, size_t n,
				 const char *what)
{
	struct vps_net_msg *msgs = NULL;
	size_t nm = 0, capm = 0;
	vps_result_t rc = VPS_OK;
	for (size_t k = 0; k < n && !rc; k++) {
		if (!forwards(sw->s, x[k]))
			continue;
		int64_t peer = vps_switch_peer(sw, x[k])->rank;
		size_t m = 0;
		while (m < nm && msgs[m].peer != peer)
			m++;
		if (m == nm) {
			if ((rc = VPS_GROW(msgs, capm, nm + 1)))
				break;
			memset(&msgs[nm], 0, sizeof(*msgs));
			msgs[nm].peer = peer;
			msgs[nm++].tag = 0x1bc4 ^ ((uint64_t)x[k]->stage << 16);
		}
		if (x[k]->src == sw->w)
			msgs[m].send = true;
		else
			msgs[m].recv = true;
	}
	if (!rc && nm) {
		char w[96];
		snprintf(w, sizeof(w), "%s (ipc: relays ready)", what);
		rc = vps_net_exchange(sw->net, msgs, nm, w);
	}
	free(msgs);
	return rc;
}

static vps_result_t ipc_stage(void *self, struct vps_switch *sw, const struct vps_xfer *const *x, size_t n,
			      const char *what)
{
	struct ipc *t = self;
	const struct vps_staged *s = sw->s;
	size_t nc = 0;
	struct vps_net_msg *msgs = vps_calloc(n + 1, sizeof(*msgs));
	if (!msgs)
		return VPS_ENOMEM;
	vps_result_t rc = VPS_OK;
	for (size_t k = 0; k < n && !rc; k++) {
		int64_t peer = vps_switch_peer(sw, x[k])->rank;
		msgs[k].peer = peer;
		msgs[k].tag = 0x1bc2 ^ ((uint64_t)x[k]->stage << 16);
		if (x[k]->src == sw->w) {
			msgs[k].recv = true; /* the receiver's "done" */
			continue;
		}
		msgs[k].send = true;
		struct ipc_peer *p = find(t, peer);
		if (!p) { /* ipc_begin found the peers of the same transfers */
			rc = vps_fail(VPS_EINTERNAL, "%s: rank %" PRId64 " sends to this rank but did not say so", what, peer);
			break;
		}
		rc = vps_grow((void **)&t->copies, &t->capc, nc + x[k]->nops, sizeof(*t->copies));
		for (size_t q = 0; q < x[k]->nops && !rc; q++) {
			const struct vps_op *op = &s->ops[x[k]->first_op + q];
			uint32_t d = desc_index(p, op->src_buffer);
			int where = VPS_WHERE_HOST;
			if (d >= p->count)
				rc = vps_fail(VPS_EPEER, "%s: rank %" PRId64 " sends from a buffer it did not describe", what, peer);
			else
				rc = vps_copy_where(op, (int)p->desc[d].where, vps_switch_dst_where(sw, op->dst_buffer), &where);
			if (!rc)
				t->copies[nc++] = (struct vps_local_copy){op, p->ptr[d], vps_switch_dst(sw, op->dst_buffer), where};
		}
	}
	if (!rc)
		rc = relays_ready(sw, x, n, what);
	/* merge the messages of one peer: a stage pairs it with one peer, in
	 * one or both directions */
	size_t nm = 0;
	for (size_t k = 0; k < n && !rc; k++) {
		size_t m = 0;
		while (m < nm && msgs[m].peer != msgs[k].peer)
			m++;
		if (m == nm)
			msgs[nm++] = msgs[k];
		else {
			msgs[m].send |= msgs[k].send;
			msgs[m].recv |= msgs[k].recv;
		}
	}
	if (!rc)
		rc = vps_copy_ops(sw, t->copies, nc);
	/* the copies are done (on a GPU, synchronized): a peer's area read for
	 * the last time is closed before this rank says so, so that its owner
	 * frees it only once nobody has it open */
	for (size_t i = 0; i < t->npeers && !rc && nc; i++) {
		struct ipc_peer *p = &t->peers[i];
		if (p->area < p->count && p->ptr[p->area] && p->area_last == x[0]->stage) {
			vps_mapcache_close(sw->maps, sw->gpu, &p->desc[p->area]);
			p->ptr[p->area] = NULL;
		}
	}
	if (!rc) {
		char w[96];
		snprintf(w, sizeof(w), "%s (ipc handshake)", what);
		rc = vps_net_exchange(sw->net, msgs, nm, w);
	}
	free(msgs);
	return rc;
}

static void ipc_end(void *self, struct vps_switch *sw)
{
	(void)sw;
	forget_peers(self);
}

static void ipc_free(void *self)
{
	struct ipc *t = self;
	if (!t)
		return;
	forget_peers(t);
	free(t->peers);
	free(t->copies);
	free(t);
}

const struct vps_transport vps_transport_ipc = {
	.name = "ipc",
	.can_connect = ipc_can_connect,
	.reach = "only this node's ranks (auto uses nccl across nodes)",
	.gpu_context = true,
	.setup = ipc_setup,
	.prepare = ipc_prepare,
	.begin = ipc_begin,
	.stage = ipc_stage,
	.end = ipc_end,
	.free = ipc_free,
};
