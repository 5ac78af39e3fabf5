/* One rank of a switch: registry, rendezvous, stages, digest, report. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "io/doc.h"
#include "gpu/gpu.h"
#include "util/internal.h"
#include "exec/net/net.h"
#include "exec/transport/transport.h"
#include "vps/data.h"
#include "vps/exec.h"
#include "vps/registry.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void vps_exec_report_release(struct vps_exec_report *r)
{
	free(r->stages);
	r->stages = NULL;
}


static vps_result_t registry_name(const char *pattern, const struct vps_plan *p, int64_t w, int64_t local, char *out,
				  size_t n)
{
	size_t len = 0;
	for (const char *c = pattern; *c && len + 24 < n; c++) {
		if (*c != '%' || !c[1]) {
			out[len++] = *c;
			continue;
		}
		int64_t v;
		switch (*++c) {
		case 'r': v = w; break;
		case 'a': v = vps_world_a_rank(p->world, w); break;
		case 'b': v = vps_world_b_rank(p->world, w); break;
		case 'l': v = local; break;
		case '%': out[len++] = '%'; continue;
		default:
			return vps_fail(VPS_EINPUT, "registry name '%s': unknown '%%%c' (%%r, %%a, %%b, %%l)", pattern, *c);
		}
		len += (size_t)snprintf(out + len, n - len, "%" PRId64, v);
	}
	out[len] = '\0';
	return VPS_OK;
}

/* ---- digest ---- */

/* The digest of a rank's part; with lost devices (vps-plan --lost), the
 * source side skips them as lower holders (they digest nothing) and the
 * target side leaves out the lost ranges (holes for the trainer to reload),
 * so both sides digest exactly what survived. */
static vps_result_t digest_part(const struct vps_layout *l, int64_t rank, void *const *buffers,
				const struct vps_lost *lost, bool source, uint64_t *digest)
{
	struct vps_rank_view v;
	struct vps_holders h = {0};
	struct vps_boxes rem = {0}, scratch = {0};
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
			sum += vps_digest_region(buffers[R->buffer], &part, &t);
		}
	}
	*digest = sum;
	rc = VPS_OK;
done:
	vps_boxes_release(&rem);
	vps_boxes_release(&scratch);
	vps_holders_release(&h);
	vps_rank_view_release(&v);
	return rc;
}

vps_result_t vps_exec_digest(const struct vps_layout *l, int64_t rank, void *const *buffers, uint64_t *digest)
{
	return digest_part(l, rank, buffers, NULL, true, digest);
}

/* Executors of a plan with lost devices form their network without them:
 * net ranks number the surviving world ranks in order (every rank of such
 * a plan lost under A is outside B, so it has no work and no executor). */
static int64_t net_rank(const struct vps_plan *p0, int64_t w)
{
	int64_t below = 0;
	for (size_t i = 0; i < p0->lost.nranks && p0->lost.ranks[i] < w; i++)
		below++;
	return w - below;
}

/* ---- one switch ---- */

int64_t vps_switch_peer(const struct vps_switch *sw, const struct vps_xfer *x)
{
	return net_rank(sw->p0, vps_world_of_device(sw->p0->world,
						    vps_world_device(sw->s->plan->world, x->src == sw->w ? x->dst : x->src)));
}

/* The training scalars of the first surviving rank's trainer (world rank 0
 * unless it was lost), and the target's split. */
static vps_result_t share_training(struct vps_net *net, const struct vps_staged *s, int64_t w,
				   struct vps_registry *reg, struct vps_registry_training *t)
{
	struct vps_registry_training mine;
	memset(t, 0, sizeof(*t));
	vps_registry_get_training(reg, &mine);
	uint64_t v[8] = {0};
	if (w == 0 && mine.valid) { /* w: this rank's net rank */
		v[0] = (uint64_t)mine.step;
		v[1] = (uint64_t)mine.consumed_samples;
		v[2] = (uint64_t)mine.scheduler_step;
		v[3] = (uint64_t)mine.global_batch;
		v[4] = (uint64_t)mine.micro_batch;
		v[7] = 1;
	}
	VPS_CHECK(vps_net_allreduce_sum(net, v, 8, "training state"));
	const struct vps_training *pt = &s->plan->train;
	t->valid = 1;
	t->dp = vps_layout_parallel(s->plan->b)->dp;
	if (v[7]) {
		t->step = (int64_t)v[0];
		t->consumed_samples = (int64_t)v[1];
		t->scheduler_step = (int64_t)v[2];
		t->global_batch = (int64_t)v[3];
		t->micro_batch = (int64_t)v[4];
	} else if (pt->known) {
		t->step = pt->step;
		t->consumed_samples = pt->consumed_samples;
		t->scheduler_step = pt->scheduler_step;
	} else {
		t->valid = 0;
	}
	if (pt->global_batch) {
		t->global_batch = pt->global_batch;
		t->micro_batch = pt->micro_batch;
	}
	/* the target's split (as vps-plan computes it) */
	if (t->global_batch) {
		if (t->global_batch % t->dp)
			return vps_fail(VPS_EINPUT, "the global batch of %" PRId64 " does not split over dp=%" PRId64,
					t->global_batch, t->dp);
		int64_t mbs = t->micro_batch > 0 ? t->micro_batch : 1;
		while (mbs > 1 && (t->global_batch / t->dp) % mbs)
			mbs--;
		t->micro_batch = mbs;
		t->grad_accum = t->global_batch / t->dp / mbs;
	}
	return VPS_OK;
}

/* The transports of an executor: which carries a transfer. */
struct carriers {
	struct vps_transport local, remote; /* peers on this rank's node, on others */
	bool remote_is_local;               /* one transport for both */
	const char *name;
};

static void carriers_free(struct carriers *c)
{
	if (c->local.ops)
		c->local.ops->free(c->local.self);
	if (c->remote.ops && !c->remote_is_local)
		c->remote.ops->free(c->remote.self);
	memset(c, 0, sizeof(*c));
}

static struct vps_transport *carrier_of(struct carriers *c, const struct vps_switch *sw, const struct vps_xfer *x)
{
	struct vps_device me = vps_world_device(sw->s->plan->world, sw->w);
	struct vps_device other = vps_world_device(sw->s->plan->world, x->src == sw->w ? x->dst : x->src);
	return me.node == other.node || c->remote_is_local ? &c->local : &c->remote;
}

static void switch_release(struct vps_switch *sw)
{
	vps_rank_view_release(&sw->va);
	vps_rank_view_release(&sw->vb);
	free(sw->src);
	free(sw->dst);
	free(sw->src_entry);
	if (sw->maps)
		vps_mapcache_end_switch(sw->maps, sw->gpu);
}

/* Where every buffer of this switch lives: all host or all GPU. */
static vps_result_t switch_where(struct vps_switch *sw, const struct vps_exec_opts *o)
{
	int where = -1;
	uint32_t n = vps_registry_num_entries(sw->reg);
	for (uint32_t i = 0; i < n; i++) {
		struct vps_registry_entry_info e;
		VPS_CHECK(vps_registry_entry(sw->reg, i, &e));
		if (where >= 0 && e.where != where)
			return vps_fail(VPS_EINPUT, "registry %s: the trainer registered host and GPU memory; a switch moves "
					"one or the other", vps_registry_name(sw->reg));
		where = e.where;
	}
	sw->where = where < 0 ? VPS_WHERE_HOST : where;
	if (sw->where == VPS_WHERE_CUDA && !sw->gpu)
		VPS_CHECK(vps_gpu_init(o->device, o->local_rank, &sw->gpu));
	return VPS_OK;
}

static vps_result_t map_side(struct vps_switch *sw, const struct vps_rank_view *v, int role, void ***ptrs,
			     int64_t **entries)
{
	struct vps_registry *reg = sw->reg;
	*ptrs = vps_calloc(v->nbuffers + 1, sizeof(void *));
	if (entries)
		*entries = vps_calloc(v->nbuffers + 1, sizeof(int64_t));
	if (!*ptrs || (entries && !*entries))
		return VPS_ENOMEM;
	const char *what = role == VPS_ROLE_SOURCE ? "source" : "target";
	for (size_t b = 0; b < v->nbuffers; b++) {
		int64_t e = vps_registry_find(reg, role, (uint32_t)b);
		if (e < 0)
			return vps_fail(VPS_EINPUT, "registry %s: the trainer registered no %s buffer %zu (%s, %s, %" PRId64
					" elements)",
					vps_registry_name(reg), what, b, vps_state_name(v->buffers[b].state),
					vps_dtype_name(v->buffers[b].dtype), v->buffers[b].elements);
		struct vps_registry_entry_info info;
		VPS_CHECK(vps_registry_entry(reg, (uint32_t)e, &info));
		if (info.elements != v->buffers[b].elements || info.dtype != v->buffers[b].dtype)
			return vps_fail(VPS_EINPUT, "registry %s: %s buffer %zu has %" PRId64 " %s elements, the layout says %" PRId64
					" %s",
					vps_registry_name(reg), what, b, info.elements, vps_dtype_name(info.dtype),
					v->buffers[b].elements, vps_dtype_name(v->buffers[b].dtype));
		struct vps_buffer_desc d = {0};
		d.where = (uint32_t)info.where;
		d.buffer = (uint32_t)b;
		d.device = info.device;
		d.offset = info.offset;
		d.bytes = info.bytes;
		snprintf(d.shm_name, sizeof(d.shm_name), "%s", info.shm_name);
		memcpy(d.ipc, info.ipc_handle, sizeof(d.ipc));
		/* a target is the next switch's source: it stays mapped */
		vps_result_t rc = vps_mapcache_map(sw->maps, sw->gpu, &d, role == VPS_ROLE_TARGET, role == VPS_ROLE_TARGET,
						   true, &(*ptrs)[b]);
		if (rc) {
			vps_error_prefix("registry %s: %s buffer %zu", vps_registry_name(reg), what, b);
			return rc;
		}
		if (entries)
			(*entries)[b] = e;
	}
	return VPS_OK;
}

static int64_t *view_bytes(const struct vps_rank_view *v)
{
	int64_t *b = vps_calloc(v->nbuffers + 1, sizeof(*b));
	for (size_t i = 0; b && i < v->nbuffers; i++)
		b[i] = v->buffers[i].elements * (int64_t)vps_dtype_size(v->buffers[i].dtype);
	return b;
}

/* Before a byte moves: every view this rank touches lies in its buffers. */
static vps_result_t check_views(const struct vps_switch *sw)
{
	const struct vps_staged *s = sw->s;
	vps_result_t rc = VPS_OK;
	int64_t *sb = view_bytes(&sw->va), *db = view_bytes(&sw->vb);
	if (!sb || !db) {
		rc = VPS_ENOMEM;
		goto done;
	}
	for (size_t i = 0; i < s->nxfers && !rc; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		bool sends = x->src == sw->w, receives = x->dst == sw->w;
		if (!sends && !receives)
			continue;
		if (x->first_op > s->nops || x->nops > s->nops - x->first_op) {
			rc = vps_fail(VPS_EINPUT, "transfer %zu: its copies lie outside the plan", i);
			break;
		}
		if ((sends && sw->ra < 0) || (receives && sw->rb < 0)) {
			rc = vps_fail(VPS_EINPUT, "transfer %zu: rank %" PRId64 " %s without a %s layout rank", i, sw->w,
				      sends ? "sends" : "receives", sends ? "source" : "target");
			break;
		}
		for (size_t q = 0; q < x->nops && !rc; q++)
			rc = vps_check_op(&s->ops[x->first_op + q], sends ? sb : NULL, sw->va.nbuffers, receives ? db : NULL,
					  sw->vb.nbuffers);
	}
done:
	free(sb);
	free(db);
	return rc;
}

/* The digest of a side, read back to the host where it is GPU memory. */
static vps_result_t side_digest(const struct vps_switch *sw, const struct vps_layout *l, int64_t rank,
				const struct vps_rank_view *v, void **bufs, uint64_t *digest)
{
	const struct vps_lost *lost = sw->s->plan->lost.nranks ? &sw->s->plan->lost : NULL;
	bool source = l == sw->s->plan->a;
	if (sw->where == VPS_WHERE_HOST)
		return digest_part(l, rank, bufs, lost, source, digest);
	vps_result_t rc = VPS_OK;
	void **host = vps_calloc(v->nbuffers + 1, sizeof(*host));
	if (!host)
		return VPS_ENOMEM;
	for (size_t b = 0; b < v->nbuffers && !rc; b++) {
		size_t n = (size_t)v->buffers[b].elements * vps_dtype_size(v->buffers[b].dtype);
		if (!(host[b] = malloc(n ? n : 1))) {
			rc = VPS_NOMEM();
			break;
		}
		char err[VPS_CUDA_ERR] = "";
		int g = sw->gpu->to_host(host[b], bufs[b], n, err);
		if (g)
			rc = vps_gpu_result(g, err, "digest: read a buffer back");
	}
	if (!rc)
		rc = digest_part(l, rank, host, lost, source, digest);
	for (size_t b = 0; b < v->nbuffers; b++)
		free(host[b]);
	free(host);
	return rc;
}

static void release_read(const struct vps_switch *sw, int64_t stage)
{
	const struct vps_staged *s = sw->s;
	for (size_t f = 0; f < s->nfrees && sw->src_entry; f++)
		if (s->frees[f].rank == sw->ra && s->frees[f].stage == stage && s->frees[f].buffer < sw->va.nbuffers)
			vps_registry_release(sw->reg, (uint32_t)sw->src_entry[s->frees[f].buffer]);
}

/* A trainer that dies mid-switch takes the state it was handed with it
 * (its GPU memory, its place in training): the switch fails, on every
 * rank, through the verdict. Looked at once the stages are done, so that
 * the other ranks learn it at the verdict, not after a timeout in a stage
 * this rank left. */
static vps_result_t trainer_watch(const struct vps_switch *sw)
{
	if (vps_registry_owner_alive(sw->reg))
		return VPS_OK;
	return vps_fail(VPS_EPEER, "the trainer (pid %d) of registry %s died during the switch",
			vps_registry_owner_pid(sw->reg), vps_registry_name(sw->reg));
}

/* Test faults (VPS_FAULT): a silent rank, a dead rank, a dead trainer. */
static void inject_fault(const struct vps_switch *sw, const struct vps_exec_opts *o)
{
	if (o->fault == VPS_FAULT_EXIT)
		_exit(3);
	if (o->fault == VPS_FAULT_STALL) {
		raise(SIGSTOP);
		return;
	}
	int pid = vps_registry_owner_pid(sw->reg);
	if (pid > 0 && pid != getpid())
		kill(pid, SIGKILL);
	/* gone means gone to the watch: wait for the kernel to say so */
	for (int i = 0; i < 500 && vps_registry_owner_alive(sw->reg); i++) {
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
}

/* The trainer's request, polled between heartbeats (vps_net_arrive). */
struct claim {
	struct vps_registry *reg;
	uint64_t after;
	double start, limit; /* limit < 0: wait as long as it takes (--wait) */
	uint64_t seq;
	bool claimed;
	const struct vps_exec_opts *o;
	struct vps_mapcache *maps;
	double next_scan;
	bool warming;
};

/* While the trainer trains: map the host buffers it has registered and
 * read their pages once, a slice a poll, so that the first pass through
 * each mapping (slow on VMs, docs/exec.md) is not paid in the pause. Best
 * effort: what fails here is found and reported when the switch maps it. */
static void prefetch(struct claim *c)
{
	double t = now();
	if (t >= c->next_scan) {
		c->next_scan = t + 0.05;
		uint32_t n = vps_registry_num_entries(c->reg);
		char(*names)[VPS_REGISTRY_NAME_MAX + 8] = vps_calloc((size_t)n + 1, sizeof(*names));
		const char **list = vps_calloc((size_t)n + 1, sizeof(*list));
		size_t k = 0;
		for (uint32_t i = 0; names && list && i < n; i++) {
			struct vps_registry_entry_info info;
			if (vps_registry_entry(c->reg, i, &info) || info.where != VPS_WHERE_HOST)
				continue;
			struct vps_buffer_desc d = {0};
			d.where = VPS_WHERE_HOST;
			d.buffer = info.buffer;
			snprintf(d.shm_name, sizeof(d.shm_name), "%s", info.shm_name);
			snprintf(names[k], sizeof(names[k]), "%s", info.shm_name);
			list[k] = names[k];
			k++;
			vps_mapcache_prefetch(c->maps, &d, info.role == VPS_ROLE_TARGET);
		}
		if (names && list)
			vps_mapcache_prune(c->maps, list, k);
		free(names);
		free(list);
		c->warming = true;
		vps_clear_error();
	}
	/* 16 MiB a poll: tens of milliseconds even where a first pass is slow,
	 * so heartbeats and the request are not held up */
	if (c->warming)
		c->warming = vps_mapcache_warm(c->maps, (size_t)16 << 20);
}

static int claim_ready(void *ctx)
{
	struct claim *c = ctx;
	vps_result_t rc = vps_registry_claim(c->reg, c->after, 0, &c->seq);
	if (!rc) {
		c->claimed = true;
		if (c->o->fault_stage == VPS_FAULT_AT_CLAIM && c->o->fault == VPS_FAULT_STALL)
			raise(SIGSTOP);
		return 1;
	}
	if (rc != VPS_ETIMEOUT)
		return -1;
	vps_clear_error();
	if (c->maps)
		prefetch(c);
	if (c->limit >= 0 && now() - c->start > c->limit) {
		vps_fail(VPS_ETIMEOUT, "registry %s: no switch requested within %.1f s", vps_registry_name(c->reg), c->limit);
		return -1;
	}
	return 0;
}

static vps_result_t run_stages(struct vps_switch *sw, struct carriers *car, const struct vps_exec_opts *o,
			       struct vps_exec_report *rep)
{
	vps_result_t rc = VPS_OK;
	const struct vps_staged *s = sw->s;
	int64_t w = sw->w;
	const struct vps_xfer **local = NULL, **remote = NULL;
	struct vps_local_copy *retain = NULL;
	size_t capl = 0, capr = 0, capc = 0;
	rep->nstages = s->nstages;
	rep->stages = vps_calloc(s->nstages + 1, sizeof(*rep->stages));
	if (!rep->stages)
		return VPS_ENOMEM;
	size_t i = 0;
	double t_all = now();
	/* sources no stage reads are free from the start */
	release_read(sw, -1);
	for (size_t st = 0; st < s->nstages; st++) {
		double t0 = now();
		struct vps_exec_stage_report *sr = &rep->stages[st];
		if (o->fault_stage == (int64_t)st)
			inject_fault(sw, o);
		while (i < s->nxfers && s->xfers[i].stage < (int64_t)st)
			i++;
		size_t j = i, nl = 0, nr = 0, nc = 0;
		while (j < s->nxfers && s->xfers[j].stage == (int64_t)st)
			j++;
		for (size_t k = i; k < j && !rc; k++) {
			const struct vps_xfer *x = &s->xfers[k];
			if (x->src == w && x->dst == w) {
				rc = VPS_GROW(retain, capc, nc + x->nops);
				for (size_t q = 0; q < x->nops && !rc; q++) {
					const struct vps_op *op = &s->ops[x->first_op + q];
					retain[nc++] = (struct vps_local_copy){op, sw->src[op->src_buffer], sw->dst[op->dst_buffer]};
					sr->bytes_copied += vps_op_bytes(op);
				}
				continue;
			}
			if (x->src != w && x->dst != w)
				continue;
			int64_t bytes = 0;
			for (size_t q = 0; q < x->nops; q++)
				bytes += vps_op_bytes(&s->ops[x->first_op + q]);
			if (x->src == w)
				sr->bytes_sent += bytes;
			else
				sr->bytes_received += bytes;
			if (carrier_of(car, sw, x) == &car->local) {
				rc = VPS_GROW(local, capl, nl + 1);
				if (!rc)
					local[nl++] = x;
			} else {
				rc = VPS_GROW(remote, capr, nr + 1);
				if (!rc)
					remote[nr++] = x;
			}
		}
		char what[64];
		snprintf(what, sizeof(what), "stage %zu of %zu", st, s->nstages);
		if (!rc)
			rc = vps_copy_ops(sw, retain, nc);
		if (!rc && nl)
			rc = car->local.ops->stage(car->local.self, sw, local, nl, what);
		if (!rc && nr)
			rc = car->remote.ops->stage(car->remote.self, sw, remote, nr, what);
		if (rc)
			goto done;
		/* sources read for the last time: the trainer may free them */
		release_read(sw, (int64_t)st);
		sr->seconds = now() - t0;
		rep->bytes_sent += sr->bytes_sent;
		rep->bytes_received += sr->bytes_received;
		rep->bytes_copied += sr->bytes_copied;
		if (o->progress)
			o->progress(o->progress_ctx, (int64_t)st, (int64_t)s->nstages,
				    sr->bytes_sent + sr->bytes_received + sr->bytes_copied, sr->seconds);
		i = j;
	}
	rep->transfer_seconds = now() - t_all;
done:
	free(local);
	free(remote);
	free(retain);
	return rc;
}

/* Every transport's begin, in order (each may talk to its peers). */
static vps_result_t begin_all(struct carriers *car, struct vps_switch *sw)
{
	if (car->local.ops && car->local.ops->begin)
		VPS_CHECK(car->local.ops->begin(car->local.self, sw));
	if (car->remote.ops && !car->remote_is_local && car->remote.ops->begin)
		VPS_CHECK(car->remote.ops->begin(car->remote.self, sw));
	return VPS_OK;
}

static void end_all(struct carriers *car, struct vps_switch *sw)
{
	if (car->local.ops && car->local.ops->end)
		car->local.ops->end(car->local.self, sw);
	if (car->remote.ops && !car->remote_is_local && car->remote.ops->end)
		car->remote.ops->end(car->remote.self, sw);
}

static vps_result_t one_switch(const struct vps_staged *s, const struct vps_plan *p0, int64_t w,
			       struct vps_registry *reg, struct vps_net *net, struct vps_mapcache *maps,
			       struct carriers *car, const struct vps_cuda_api **gpu, const struct vps_exec_opts *o,
			       uint64_t *last_seq, struct vps_exec_report *rep)
{
	vps_result_t rc;
	struct vps_switch sw = {0};
	const struct vps_plan *p = s->plan;
	uint64_t seq = 0;
	bool claimed = false, begun = false;
	sw.s = s;
	sw.p0 = p0;
	sw.w = w;
	sw.ra = vps_world_a_rank(p->world, w);
	sw.rb = vps_world_b_rank(p->world, w);
	sw.reg = reg;
	sw.net = net;
	sw.maps = maps;
	sw.gpu = *gpu;
	sw.timeout = o->timeout;
	rep->rank = w;
	rep->world = vps_world_size(p->world);
	rep->transport = car->name;
	double t0 = now();
	/* a slow trainer is not a dead one (that one is seen at once): its
	 * request may take as long as the ranks' may lie apart */
	struct claim c = {reg, *last_seq, t0, o->wait ? -1 : vps_max64((int64_t)o->request_timeout, (int64_t)o->timeout),
			  0, false, o, maps, 0, false};
	rc = vps_net_arrive(net, claim_ready, &c, vps_max64((int64_t)o->request_timeout, (int64_t)o->timeout));
	claimed = c.claimed;
	seq = c.seq;
	if (rc)
		goto fail;
	*last_seq = seq;
	rep->switch_seq = seq;
	rep->waited_seconds = now() - t0;
	double t_pause = now();
	uint64_t stale[2];
	vps_mapcache_take_stats(maps, &stale[0], &stale[1]);
	/* the trainer's registry must describe this plan's two layouts */
	uint64_t ha = vps_layout_hash(p->a), hb = vps_layout_hash(p->b);
	if (sw.ra >= 0 && (vps_registry_layout_hash(reg) != ha || vps_registry_rank(reg) != sw.ra)) {
		rc = vps_fail(VPS_EINPUT,
			      "registry %s: the trainer runs layout 0x%016" PRIx64 " rank %" PRId64
			      ", the plan's source is 0x%016" PRIx64 " rank %" PRId64,
			      vps_registry_name(reg), vps_registry_layout_hash(reg), vps_registry_rank(reg), ha, sw.ra);
		goto fail;
	}
	if (vps_registry_target_hash(reg) != hb || vps_registry_target_rank(reg) != sw.rb) {
		rc = vps_fail(VPS_EINPUT,
			      "registry %s: the trainer switches to layout 0x%016" PRIx64 " rank %" PRId64
			      ", the plan's target is 0x%016" PRIx64 " rank %" PRId64,
			      vps_registry_name(reg), vps_registry_target_hash(reg), vps_registry_target_rank(reg), hb, sw.rb);
		goto fail;
	}
	VPS_CHECK_GOTO(switch_where(&sw, o), rc, fail);
	*gpu = sw.gpu;
	if (sw.ra >= 0) {
		VPS_CHECK_GOTO(vps_layout_rank(p->a, sw.ra, &sw.va), rc, fail);
		VPS_CHECK_GOTO(map_side(&sw, &sw.va, VPS_ROLE_SOURCE, &sw.src, &sw.src_entry), rc, fail);
	}
	if (sw.rb >= 0) {
		VPS_CHECK_GOTO(vps_layout_rank(p->b, sw.rb, &sw.vb), rc, fail);
		VPS_CHECK_GOTO(map_side(&sw, &sw.vb, VPS_ROLE_TARGET, &sw.dst, NULL), rc, fail);
	}
	VPS_CHECK_GOTO(check_views(&sw), rc, fail);
	vps_mapcache_take_stats(maps, &rep->premapped_bytes, &rep->mapped_in_pause_bytes);
	rep->attach_seconds = now() - t_pause;
	/* every rank has arrived (vps_net_arrive): from here on a silent rank
	 * is found within the ordinary timeout */
	struct vps_registry_training train;
	double t_agree = now();
	rc = share_training(net, s, net_rank(p0, vps_world_of_device(p0->world, vps_world_device(p->world, w))), reg,
			    &train);
	rep->agree_seconds += now() - t_agree;
	if (rc)
		goto fail;
	uint64_t dig[2] = {0, 0};
	double t_begin = now();
	begun = true;
	rc = begin_all(car, &sw);
	if (!rc && o->check && sw.ra >= 0)
		rc = side_digest(&sw, p->a, sw.ra, &sw.va, sw.src, &dig[0]);
	rep->attach_seconds += now() - t_begin;
	{
		/* no byte moves before every rank is ready; one that is not says why */
		char mine[1024];
		snprintf(mine, sizeof(mine), "%s", vps_last_error());
		t_agree = now();
		vps_result_t agreed = vps_net_agree(net, rc == VPS_OK, "start");
		rep->agree_seconds += now() - t_agree;
		if (rc) {
			vps_fail(rc, "%s", mine);
			goto fail;
		}
		VPS_CHECK_GOTO(agreed, rc, fail);
	}
	rc = run_stages(&sw, car, o, rep);
	if (!rc)
		rc = trainer_watch(&sw);
	if (!rc && o->check && sw.rb >= 0)
		rc = side_digest(&sw, p->b, sw.rb, &sw.vb, sw.dst, &dig[1]);
	{
		/* the verdict is global: done only when every rank moved its part
		 * (and the digests match); a rank keeps its own failure's words */
		char mine[1024];
		snprintf(mine, sizeof(mine), "%s", vps_last_error());
		t_agree = now();
		vps_result_t agreed = vps_net_agree(net, rc == VPS_OK, "end of transfer");
		rep->agree_seconds += now() - t_agree;
		if (rc)
			vps_fail(rc, "%s", mine);
		else
			rc = agreed;
	}
	if (!rc && o->check) {
		VPS_CHECK_GOTO(vps_net_allreduce_sum(net, dig, 2, "digest"), rc, fail);
		rep->checked = true;
		rep->digest_before = dig[0];
		rep->digest_after = dig[1];
		rep->digest_match = dig[0] == dig[1];
		if (!rep->digest_match) {
			rc = vps_fail(VPS_ECHECK, "digest mismatch: 0x%016" PRIx64 " before, 0x%016" PRIx64 " after", dig[0],
				      dig[1]);
			goto fail;
		}
	}
	if (rc)
		goto fail;
	end_all(car, &sw);
	switch_release(&sw);
	vps_registry_set_training(reg, &train);
	vps_registry_finish(reg, seq, 1, NULL);
	rep->pause_seconds = now() - t_pause;
	return VPS_OK;
fail:
	if (begun)
		end_all(car, &sw);
	switch_release(&sw);
	if (claimed)
		vps_registry_finish(reg, seq, 0, vps_last_error());
	return rc;
}

/* The transports, made once per executor (NCCL's communicator too). */
static vps_result_t carriers_start(struct carriers *car, struct vps_staged *const *plans, size_t nplans,
				   struct vps_net *net, const struct vps_exec_opts *o)
{
	switch (o->transport) {
	case VPS_EXEC_TCP:
		car->name = "tcp";
		car->remote_is_local = true;
		return vps_transport_tcp(&car->local);
	case VPS_EXEC_IPC:
		car->name = "ipc";
		car->remote_is_local = true;
		return vps_transport_ipc(&car->local, true);
	case VPS_EXEC_NCCL:
	case VPS_EXEC_AUTO:
		break;
	default:
		return vps_fail(VPS_EINPUT, "unknown transport %d", o->transport);
	}
	/* nccl for every peer, or (auto) for the peers of other nodes: then a
	 * communicator is made only when some rank has such a peer, which the
	 * ranks learn together */
	uint64_t off_node = o->transport == VPS_EXEC_NCCL;
	const struct vps_plan *p0 = plans[0]->plan;
	struct vps_device me = vps_world_device(p0->world, o->rank);
	for (size_t k = 0; k < nplans && !off_node; k++) {
		const struct vps_staged *s = plans[k]->plan ? plans[k] : NULL;
		int64_t w = vps_world_of_device(s->plan->world, me);
		for (size_t i = 0; i < s->nxfers && !off_node; i++) {
			const struct vps_xfer *x = &s->xfers[i];
			if (x->src == x->dst || (x->src != w && x->dst != w))
				continue;
			off_node = vps_world_device(s->plan->world, x->src == w ? x->dst : x->src).node != me.node;
		}
	}
	if (o->transport == VPS_EXEC_AUTO)
		VPS_CHECK(vps_net_allreduce_sum(net, &off_node, 1, "transports"));
	if (o->transport == VPS_EXEC_AUTO) {
		car->name = "ipc";
		VPS_CHECK(vps_transport_ipc(&car->local, false));
		if (!off_node) {
			car->remote_is_local = true;
			return VPS_OK;
		}
		car->name = "ipc+nccl";
	} else {
		car->name = "nccl";
		car->remote_is_local = true;
	}
	return vps_transport_nccl(car->remote_is_local ? &car->local : &car->remote, net, net_rank(p0, o->rank),
				  vps_world_size(p0->world) - (int64_t)p0->lost.nranks, o->device, o->local_rank);
}

/* Every rank cuts the same stages from the world's demands: its own,
 * all-reduced (O(steps) numbers, log2 W rounds). A plan staged from the
 * global plan is already cut and must agree. Done before the trainers ask
 * for the switch, so it costs the pause nothing. */
static vps_result_t agree_stages(struct vps_net *net, struct vps_staged *const *plans, size_t nplans)
{
	for (size_t k = 0; k < nplans; k++) {
		int64_t *d;
		char what[64];
		snprintf(what, sizeof(what), "stage boundaries of plan %zu", k + 1);
		VPS_CHECK(vps_staged_demand(plans[k], &d));
		vps_result_t rc = vps_net_allreduce(net, d, VPS_DEMAND_COUNT(plans[k]->steps), vps_stage_demand_combine, what);
		if (!rc && (rc = vps_staged_cut(plans[k], d)))
			vps_error_prefix("staged plan %zu", k + 1);
		free(d);
		VPS_CHECK(rc);
	}
	return VPS_OK;
}

/* Wait for the trainer's registry: absent or half made (the trainer has not
 * started) or stale (a crashed run's, which the trainer replaces when it
 * starts). A stale one is waited for at most `timeout` even under --wait. */
static vps_result_t open_registry(const char *name, double wait, double timeout, struct vps_registry **out)
{
	double t0 = now();
	for (;;) {
		vps_result_t rc = vps_registry_open(out, name);
		if (!rc)
			return VPS_OK;
		const char *e = vps_last_error();
		bool absent = strstr(e, "No such file") || strstr(e, "not ready yet");
		bool stale = strstr(e, "is stale") != NULL;
		if (!absent && !stale)
			return rc;
		double waited = now() - t0;
		if ((stale && waited > timeout) || (wait >= 0 && waited > wait))
			return rc;
		struct timespec ts = {0, 20000000};
		nanosleep(&ts, NULL);
	}
}

vps_result_t vps_exec_run(struct vps_staged *const *plans, size_t nplans, const struct vps_exec_opts *o,
			  struct vps_exec_report *reports)
{
	vps_result_t rc = VPS_OK;
	struct vps_registry *reg = NULL;
	struct vps_net *net = NULL;
	struct vps_mapcache *maps = NULL;
	struct carriers car = {0};
	const struct vps_cuda_api *gpu = NULL;
	int64_t *peers = NULL;
	size_t npeers = 0, capp = 0;
	char name[VPS_REGISTRY_NAME_MAX + 32];
	if (!nplans)
		return vps_fail(VPS_EINPUT, "no staged plan");
	const struct vps_plan *p0 = plans[0]->plan;
	int64_t W = vps_world_size(p0->world);
	if (o->rank < 0 || o->rank >= W)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the transition world of %" PRId64, o->rank, W);
	if (W > 1 && (!o->token || strlen(o->token) < VPS_TOKEN_MIN))
		return vps_fail(VPS_EINPUT, "no job token: export VPS_TOKEN (vps-exec --new-token makes one) or pass --token-file;"
				" vps-exec(1) SECURITY");
	if (vps_lost_has_rank(&p0->lost, o->rank))
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is a lost device of the plan: it has no part in the switch",
				o->rank);
	struct vps_device me = vps_world_device(p0->world, o->rank);
	uint64_t hash = 0;
	/* every plan over the same devices; peers in the first plan's numbering */
	for (size_t k = 0; k < nplans; k++) {
		const struct vps_staged *s = plans[k];
		VPS_CHECK(vps_plan_check_hash(s->plan, "plan"));
		if (s->file_hash && s->file_hash != vps_staged_hash(s))
			return vps_fail(VPS_EINPUT, "staged plan %zu: its content does not hash to what it states", k + 1);
		if (s->scope >= 0 && vps_world_of_device(s->plan->world, me) != s->scope)
			return vps_fail(VPS_EINPUT, "staged plan %zu holds rank %" PRId64 "'s part, not this rank's", k + 1,
					s->scope);
		if (vps_world_size(s->plan->world) != W)
			return vps_fail(VPS_EINPUT, "staged plan %zu has a world of %" PRId64 ", the first %" PRId64, k + 1,
					vps_world_size(s->plan->world), W);
		int64_t w = vps_world_of_device(s->plan->world, me);
		if (w < 0)
			return vps_fail(VPS_EINPUT, "staged plan %zu does not use node %d gpu %d", k + 1, me.node, me.gpu);
		for (size_t i = 0; i < s->nxfers; i++) {
			const struct vps_xfer *x = &s->xfers[i];
			if (x->src == x->dst || (x->src != w && x->dst != w))
				continue;
			int64_t q = vps_world_of_device(p0->world, vps_world_device(s->plan->world, x->src == w ? x->dst : x->src));
			if (q < 0)
				return vps_fail(VPS_EINPUT, "staged plan %zu uses a device the first plan does not", k + 1);
			if (vps_lost_has_rank(&p0->lost, q))
				return vps_fail(VPS_EINPUT, "staged plan %zu uses a device the first plan lost", k + 1);
			VPS_CHECK_GOTO(VPS_GROW(peers, capp, npeers + 1), rc, done);
			peers[npeers++] = net_rank(p0, q);
		}
		uint64_t hk = vps_staged_world_hash(s);
		hash = vps_hash64(&hk, sizeof(hk), hash);
	}
	/* the stages' all-reduce runs between XOR partners (vps_net_allreduce) */
	int64_t tree[64], nr = net_rank(p0, o->rank), nw = W - (int64_t)p0->lost.nranks;
	size_t ntree = vps_net_tree_peers(nr, nw, tree);
	for (size_t i = 0; i < ntree; i++) {
		VPS_CHECK_GOTO(VPS_GROW(peers, capp, npeers + 1), rc, done);
		peers[npeers++] = tree[i];
	}
	VPS_CHECK_GOTO(registry_name(o->registry, p0, o->rank, o->local_rank, name, sizeof(name)), rc, done);
	double t_setup = now();
	VPS_CHECK_GOTO(open_registry(name, o->wait ? -1 : o->timeout, o->timeout, &reg), rc, done);
	struct vps_net_opts no = {nr, nw, o->master_host, o->master_port, o->timeout, o->token, o->bind, hash, peers, npeers};
	VPS_CHECK_GOTO(vps_net_start(&net, &no), rc, done);
	VPS_CHECK_GOTO(agree_stages(net, plans, nplans), rc, done);
	VPS_CHECK_GOTO(vps_mapcache_new(&maps), rc, done);
	VPS_CHECK_GOTO(carriers_start(&car, plans, nplans, net, o), rc, done);
	/* ipc may move GPU memory: make the CUDA context now, while the
	 * trainer trains, not in the pause (host memory needs none: a machine
	 * without a GPU goes on) */
	if (o->transport == VPS_EXEC_IPC || o->transport == VPS_EXEC_AUTO) {
		const struct vps_cuda_api *api;
		int n = 0;
		char err[VPS_CUDA_ERR];
		if (!vps_gpu_api(&api) && !api->device_count(&n, err) && n > 0 &&
		    vps_gpu_init(o->device, o->local_rank, &api) == VPS_OK)
			gpu = api;
		vps_clear_error();
	}
	double setup = now() - t_setup;
	uint64_t last_seq = 0;
	vps_registry_state(reg, &last_seq);
	/* a request made before we attached counts */
	if (vps_registry_state(reg, NULL) == VPS_REG_REQUESTED && last_seq)
		last_seq--;
	for (size_t k = 0; k < nplans; k++) {
		memset(&reports[k], 0, sizeof(reports[k]));
		reports[k].setup_seconds = k ? 0 : setup;
		int64_t w = vps_world_of_device(plans[k]->plan->world, me);
		rc = one_switch(plans[k], p0, w, reg, net, maps, &car, &gpu, o, &last_seq, &reports[k]);
		if (rc)
			goto done;
	}
done:
	if (rc && reg) {
		char msg[256];
		snprintf(msg, sizeof(msg), "rank %" PRId64 ": %s", o->rank, vps_last_error());
		vps_registry_abort(reg, msg);
	}
	carriers_free(&car);
	vps_mapcache_free(maps);
	vps_net_free(net);
	vps_registry_close(reg);
	free(peers);
	return rc;
}

/* ---- report ---- */

vps_result_t vps_exec_report_yaml(const struct vps_exec_report *reps, size_t n, struct vps_bytes *out)
{
	struct vps_writer *w;
	vps_result_t rc;
	VPS_CHECK(vps_writer_new(&w, VPS_DOC_REPORT, true));
	VPS_CHECK_GOTO(vps_w_seq_begin(w, "switches", n, false), rc, done);
	for (size_t k = 0; k < n; k++) {
		const struct vps_exec_report *r = &reps[k];
		double moved = (double)(r->bytes_sent + r->bytes_received);
		VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "rank", r->rank), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "world", r->world), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "switch", (int64_t)r->switch_seq), rc, done);
		VPS_CHECK_GOTO(vps_w_str(w, "transport", r->transport ? r->transport : "tcp"), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_sent", r->bytes_sent), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_received", r->bytes_received), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_copied", r->bytes_copied), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "setup_seconds", r->setup_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "waited_seconds", r->waited_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "pause_seconds", r->pause_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "attach_seconds", r->attach_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "agree_seconds", r->agree_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "transfer_seconds", r->transfer_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "gb_per_second",
					    r->transfer_seconds > 0 ? moved / r->transfer_seconds / 1e9 : 0.0),
			       rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "premapped_bytes", (int64_t)r->premapped_bytes), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "mapped_in_pause_bytes", (int64_t)r->mapped_in_pause_bytes), rc, done);
		VPS_CHECK_GOTO(vps_w_str(w, "digest", !r->checked ? "not checked" : r->digest_match ? "match" : "mismatch"),
			       rc, done);
		VPS_CHECK_GOTO(vps_w_u64hex(w, "digest_value", r->digest_after), rc, done);
		VPS_CHECK_GOTO(vps_w_seq_begin(w, "stages", r->nstages, false), rc, done);
		for (size_t i = 0; i < r->nstages; i++) {
			const struct vps_exec_stage_report *st = &r->stages[i];
			double b = (double)(st->bytes_sent + st->bytes_received);
			VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "stage", (int64_t)i), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "bytes_sent", st->bytes_sent), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "bytes_received", st->bytes_received), rc, done);
			VPS_CHECK_GOTO(vps_w_int(w, "bytes_copied", st->bytes_copied), rc, done);
			VPS_CHECK_GOTO(vps_w_double(w, "seconds", st->seconds), rc, done);
			VPS_CHECK_GOTO(vps_w_double(w, "gb_per_second", st->seconds > 0 ? b / st->seconds / 1e9 : 0.0), rc,
				       done);
			VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
		}
		VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
		VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
	}
	VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
	rc = vps_writer_finish(w, out);
done:
	vps_writer_free(w);
	return rc;
}
