/* The executor: one rank's part of a job's switches (vps_exec_run). What
 * lasts across the switches of a --serve is one struct executor; each
 * switch is a sequence of named steps, from claiming the trainer's request
 * to reporting to it (one_switch). lib/exec/README.md, docs/exec.md. */
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
			return vps_fail(VPS_EINPUT, "--registry: unknown '%%%c' in '%s' (%%r, %%a, %%b, %%l)", *c, pattern);
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

/* ---- peers ---- */

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

/* Plan k's peer map (struct vps_switch's peers): for each transfer of
 * world rank w (the device me) with another rank, that rank's net rank
 * and node. The first plan numbers the network: a later plan's device
 * must be one of its, and not one it lost. */
static vps_result_t peer_map(const struct vps_staged *s, size_t k, const struct vps_plan *p0, struct vps_device me,
			     int64_t w, struct vps_peer_info **out)
{
	struct vps_peer_info *m = vps_calloc(s->nxfers + 1, sizeof(*m));
	if (!m)
		return VPS_ENOMEM;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		m[i].rank = -1;
		if (x->src == x->dst || (x->src != w && x->dst != w))
			continue;
		struct vps_device d = vps_world_device(s->plan->world, x->src == w ? x->dst : x->src);
		int64_t q = vps_world_of_device(p0->world, d);
		vps_result_t rc = VPS_OK;
		if (q < 0)
			rc = vps_fail(VPS_EINPUT, "staged plan %zu uses a device the first plan does not", k + 1);
		else if (vps_lost_has_rank(&p0->lost, q))
			rc = vps_fail(VPS_EINPUT, "staged plan %zu uses a device the first plan lost", k + 1);
		if (rc) {
			free(m);
			return rc;
		}
		m[i] = (struct vps_peer_info){net_rank(p0, q), d.node, d.node == me.node};
	}
	*out = m;
	return VPS_OK;
}

/* ---- the transports of an executor ---- */

/* The transports of an executor, as --transport lists them: each peer's
 * transfers go by the first that can reach it. */
struct carriers {
	struct carrier {
		const struct vps_transport *t; /* NULL: not made (no rank needs it) */
		void *self;
		const struct vps_xfer **x;     /* its transfers of a switch, or of a stage */
		size_t n, cap;
	} v[VPS_TRANSPORT_MAX];
	size_t n;
	const char *name;                      /* of those made, for reports: "ipc+nccl" */
};

static void carriers_free(struct carriers *c)
{
	for (size_t j = 0; j < c->n; j++) {
		if (c->v[j].t)
			c->v[j].t->free(c->v[j].self);
		free(c->v[j].x);
	}
	memset(c, 0, sizeof(*c));
}

/* The first transport that reaches peer, or -1. */
static int carrier_of(const struct carriers *c, const struct vps_peer_info *peer)
{
	for (size_t j = 0; j < c->n; j++)
		if (c->v[j].t && c->v[j].t->can_connect(peer))
			return (int)j;
	return -1;
}

/* A transfer that no transport of --transport reaches. */
static vps_result_t unreachable(const struct carriers *c, const struct vps_switch *sw, const struct vps_peer_info *peer)
{
	const char *reach = "";
	for (size_t j = 0; j < c->n; j++)
		if (c->v[j].t && c->v[j].t->reach)
			reach = c->v[j].t->reach;
	return vps_fail(VPS_EINPUT, "--transport %s: rank %" PRId64 " exchanges with a device on node %d, and %s reaches %s",
			c->name, sw->w, peer->node, c->name, reach);
}

/* Hand transfer x to its transport's list. */
static vps_result_t carry(struct carriers *c, const struct vps_switch *sw, const struct vps_xfer *x)
{
	const struct vps_peer_info *peer = vps_switch_peer(sw, x);
	int j = carrier_of(c, peer);
	if (j < 0)
		return unreachable(c, sw, peer);
	struct carrier *v = &c->v[j];
	VPS_CHECK(VPS_GROW(v->x, v->cap, v->n + 1));
	v->x[v->n++] = x;
	return VPS_OK;
}

/* Which transport carries each of this rank's transfers of the switch,
 * then every transport's begin with its transfers, in order (each may talk
 * to its peers). */
static vps_result_t begin_all(struct carriers *car, struct vps_switch *sw)
{
	const struct vps_staged *s = sw->s;
	for (size_t c = 0; c < car->n; c++)
		car->v[c].n = 0;
	for (size_t i = 0; i < s->nxfers; i++)
		if (sw->peers[i].rank >= 0)
			VPS_CHECK(carry(car, sw, &s->xfers[i]));
	for (size_t c = 0; c < car->n; c++)
		if (car->v[c].t && car->v[c].t->begin)
			VPS_CHECK(car->v[c].t->begin(car->v[c].self, sw, car->v[c].x, car->v[c].n));
	return VPS_OK;
}

static void end_all(struct carriers *car, struct vps_switch *sw)
{
	for (size_t c = 0; c < car->n; c++)
		if (car->v[c].t && car->v[c].t->end)
			car->v[c].t->end(car->v[c].self, sw);
}

/* ---- the executor, and the parts of a switch ---- */

/* One executor: what lasts across the switches of a --serve. */
struct executor {
	const struct vps_exec_opts *o;
	struct vps_staged *const *plans;
	size_t nplans;
	const struct vps_plan *p0;     /* its world numbers the network */
	struct vps_device me;          /* this rank's device */
	int64_t net_rank, net_world;   /* the surviving ranks, in order */
	uint64_t hash;                 /* of the plans' worlds: every rank must hold the same */
	struct vps_peer_info **peers;  /* by plan: its peer map */
	int64_t *mesh;                 /* the net ranks this rank exchanges with */
	size_t nmesh, capmesh;
	struct vps_registry *reg;
	struct vps_net *net;
	struct vps_mapcache *maps;
	struct carriers car;
	const struct vps_cuda_api *gpu; /* made when a transport or the memory needs it */
	uint64_t last_seq;             /* the trainer's last request claimed */
};

/* What one switch holds while it runs. */
struct pass {
	struct vps_switch sw;
	uint64_t seq;
	bool claimed, begun;
	double t_pause;
	struct vps_registry_training train;
	uint64_t digest[2];            /* this rank's part before and after (--check) */
};

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

/* Stage transfers [i, j) of this rank: its retains as local copies, the
 * others handed to their transports, their bytes counted. */
static vps_result_t sort_stage(const struct vps_switch *sw, struct carriers *car, size_t i, size_t j,
			       struct vps_local_copy **retain, size_t *capc, size_t *nc, struct vps_exec_stage_report *sr)
{
	const struct vps_staged *s = sw->s;
	for (size_t c = 0; c < car->n; c++)
		car->v[c].n = 0;
	*nc = 0;
	for (size_t k = i; k < j; k++) {
		const struct vps_xfer *x = &s->xfers[k];
		if (x->src == sw->w && x->dst == sw->w) {
			VPS_CHECK(vps_grow((void **)retain, capc, *nc + x->nops, sizeof(**retain)));
			for (size_t q = 0; q < x->nops; q++) {
				const struct vps_op *op = &s->ops[x->first_op + q];
				(*retain)[(*nc)++] = (struct vps_local_copy){op, sw->src[op->src_buffer], sw->dst[op->dst_buffer]};
				sr->bytes_copied += vps_op_bytes(op);
			}
			continue;
		}
		if (x->src != sw->w && x->dst != sw->w)
			continue;
		int64_t bytes = 0;
		for (size_t q = 0; q < x->nops; q++)
			bytes += vps_op_bytes(&s->ops[x->first_op + q]);
		if (x->src == sw->w)
			sr->bytes_sent += bytes;
		else
			sr->bytes_received += bytes;
		VPS_CHECK(carry(car, sw, x));
	}
	return VPS_OK;
}

static vps_result_t run_stages(struct vps_switch *sw, struct carriers *car, const struct vps_exec_opts *o,
			       struct vps_exec_report *rep)
{
	vps_result_t rc = VPS_OK;
	const struct vps_staged *s = sw->s;
	struct vps_local_copy *retain = NULL;
	size_t capc = 0, nc = 0, i = 0;
	rep->nstages = s->nstages;
	rep->stages = vps_calloc(s->nstages + 1, sizeof(*rep->stages));
	if (!rep->stages)
		return VPS_ENOMEM;
	double t_all = now();
	/* sources no stage reads are free from the start */
	release_read(sw, -1);
	for (size_t st = 0; st < s->nstages && !rc; st++) {
		double t0 = now();
		struct vps_exec_stage_report *sr = &rep->stages[st];
		if (o->fault_stage == (int64_t)st)
			inject_fault(sw, o);
		while (i < s->nxfers && s->xfers[i].stage < (int64_t)st)
			i++;
		size_t j = i;
		while (j < s->nxfers && s->xfers[j].stage == (int64_t)st)
			j++;
		char what[64];
		snprintf(what, sizeof(what), "stage %zu of %zu", st, s->nstages);
		rc = sort_stage(sw, car, i, j, &retain, &capc, &nc, sr);
		if (!rc)
			rc = vps_copy_ops(sw, retain, nc);
		for (size_t c = 0; c < car->n && !rc; c++)
			if (car->v[c].n)
				rc = car->v[c].t->stage(car->v[c].self, sw, car->v[c].x, car->v[c].n, what);
		if (rc)
			break;
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
	if (!rc)
		rep->transfer_seconds = now() - t_all;
	free(retain);
	return rc;
}

/* ---- the steps of a switch ---- */

/* A timed vps_net_agree_result: the ranks' time in the rendezvous. */
static vps_result_t agree(struct executor *ex, vps_result_t mine, const char *what, struct vps_exec_report *rep)
{
	double t = now();
	vps_result_t rc = vps_net_agree_result(ex->net, mine, what);
	rep->agree_seconds += now() - t;
	return rc;
}

/* Claim: every rank's trainer has requested the switch. */
static vps_result_t claim(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	const struct vps_exec_opts *o = ex->o;
	double t0 = now();
	/* a slow trainer is not a dead one (that one is seen at once): its
	 * request may take as long as the ranks' may lie apart */
	double window = (double)vps_max64((int64_t)o->request_timeout, (int64_t)o->timeout);
	struct claim c = {ex->reg, ex->last_seq, t0, o->wait ? -1 : window, 0, false, o, ex->maps, 0, false};
	vps_result_t rc = vps_net_arrive(ex->net, claim_ready, &c, window);
	ps->claimed = c.claimed;
	ps->seq = c.seq;
	if (rc)
		return rc;
	ex->last_seq = c.seq;
	rep->switch_seq = c.seq;
	rep->waited_seconds = now() - t0;
	ps->t_pause = now();
	/* what the waiting mapped is not the pause's */
	uint64_t before[2];
	vps_mapcache_take_stats(ex->maps, &before[0], &before[1]);
	return VPS_OK;
}

/* The trainer's registry must describe this plan's two layouts. */
static vps_result_t check_registry(const struct vps_switch *sw)
{
	const struct vps_plan *p = sw->s->plan;
	struct vps_registry *reg = sw->reg;
	uint64_t ha = vps_layout_hash(p->a), hb = vps_layout_hash(p->b);
	if (sw->ra >= 0 && (vps_registry_layout_hash(reg) != ha || vps_registry_rank(reg) != sw->ra))
		return vps_fail(VPS_EINPUT,
				"registry %s: the trainer runs layout 0x%016" PRIx64 " rank %" PRId64
				", the plan's source is 0x%016" PRIx64 " rank %" PRId64,
				vps_registry_name(reg), vps_registry_layout_hash(reg), vps_registry_rank(reg), ha, sw->ra);
	if (vps_registry_target_hash(reg) != hb || vps_registry_target_rank(reg) != sw->rb)
		return vps_fail(VPS_EINPUT,
				"registry %s: the trainer switches to layout 0x%016" PRIx64 " rank %" PRId64
				", the plan's target is 0x%016" PRIx64 " rank %" PRId64,
				vps_registry_name(reg), vps_registry_target_hash(reg), vps_registry_target_rank(reg), hb, sw->rb);
	return VPS_OK;
}

/* Attach: the trainer's buffers, mapped and checked against the plan. */
static vps_result_t attach(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	struct vps_switch *sw = &ps->sw;
	const struct vps_plan *p = sw->s->plan;
	VPS_CHECK(check_registry(sw));
	VPS_CHECK(switch_where(sw, ex->o));
	ex->gpu = sw->gpu;
	if (sw->ra >= 0) {
		VPS_CHECK(vps_layout_rank(p->a, sw->ra, &sw->va));
		VPS_CHECK(map_side(sw, &sw->va, VPS_ROLE_SOURCE, &sw->src, &sw->src_entry));
	}
	if (sw->rb >= 0) {
		VPS_CHECK(vps_layout_rank(p->b, sw->rb, &sw->vb));
		VPS_CHECK(map_side(sw, &sw->vb, VPS_ROLE_TARGET, &sw->dst, NULL));
	}
	VPS_CHECK(check_views(sw));
	vps_mapcache_take_stats(ex->maps, &rep->premapped_bytes, &rep->mapped_in_pause_bytes);
	rep->attach_seconds = now() - ps->t_pause;
	return VPS_OK;
}

/* Agree: the training state every trainer goes on from. Every rank has
 * arrived (vps_net_arrive): from here on a silent rank is found within the
 * ordinary timeout. */
static vps_result_t agree_training(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	double t = now();
	vps_result_t rc = share_training(ex->net, ps->sw.s, ex->net_rank, ex->reg, &ps->train);
	rep->agree_seconds += now() - t;
	return rc;
}

/* The start: every transport's begin, the sources' digest, and no byte
 * moves before every rank is ready; one that is not says why. */
static vps_result_t start(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	struct vps_switch *sw = &ps->sw;
	double t = now();
	ps->begun = true;
	vps_result_t rc = begin_all(&ex->car, sw);
	if (!rc && ex->o->check && sw->ra >= 0)
		rc = side_digest(sw, sw->s->plan->a, sw->ra, &sw->va, sw->src, &ps->digest[0]);
	rep->attach_seconds += now() - t;
	return agree(ex, rc, "start", rep);
}

/* The stages, then what this rank can tell of its part: its trainer
 * alive, its targets' digest. */
static vps_result_t stages(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	struct vps_switch *sw = &ps->sw;
	VPS_CHECK(run_stages(sw, &ex->car, ex->o, rep));
	VPS_CHECK(trainer_watch(sw));
	if (ex->o->check && sw->rb >= 0)
		VPS_CHECK(side_digest(sw, sw->s->plan->b, sw->rb, &sw->vb, sw->dst, &ps->digest[1]));
	return VPS_OK;
}

/* The verdict is global: done only when every rank moved its part (and
 * the digests match); a rank keeps its own failure's words. */
static vps_result_t verdict(struct executor *ex, vps_result_t mine, struct vps_exec_report *rep)
{
	return agree(ex, mine, "end of transfer", rep);
}

/* Digest: the parts' sums before and after, over all ranks, must match. */
static vps_result_t digest(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	if (!ex->o->check)
		return VPS_OK;
	uint64_t *dig = ps->digest;
	VPS_CHECK(vps_net_allreduce_sum(ex->net, dig, 2, "digest"));
	rep->checked = true;
	rep->digest_before = dig[0];
	rep->digest_after = dig[1];
	rep->digest_match = dig[0] == dig[1];
	if (!rep->digest_match)
		return vps_fail(VPS_ECHECK, "digest mismatch: 0x%016" PRIx64 " before, 0x%016" PRIx64 " after", dig[0],
				dig[1]);
	return VPS_OK;
}

/* Report to the trainer: done, with the training state to go on from, or
 * failed, and why. */
static vps_result_t report(struct executor *ex, struct pass *ps, vps_result_t rc, struct vps_exec_report *rep)
{
	if (ps->begun)
		end_all(&ex->car, &ps->sw);
	switch_release(&ps->sw);
	if (rc) {
		if (ps->claimed)
			vps_registry_finish(ex->reg, ps->seq, 0, vps_last_error());
		return rc;
	}
	vps_registry_set_training(ex->reg, &ps->train);
	vps_registry_finish(ex->reg, ps->seq, 1, NULL);
	rep->pause_seconds = now() - ps->t_pause;
	return VPS_OK;
}

/* Switch k, the executor's plan k. */
static vps_result_t one_switch(struct executor *ex, size_t k, struct vps_exec_report *rep)
{
	const struct vps_plan *p = ex->plans[k]->plan;
	struct pass ps = {0};
	struct vps_switch *sw = &ps.sw;
	sw->s = ex->plans[k];
	sw->peers = ex->peers[k];
	sw->w = vps_world_of_device(p->world, ex->me);
	sw->ra = vps_world_a_rank(p->world, sw->w);
	sw->rb = vps_world_b_rank(p->world, sw->w);
	sw->reg = ex->reg;
	sw->net = ex->net;
	sw->maps = ex->maps;
	sw->gpu = ex->gpu;
	sw->timeout = ex->o->timeout;
	rep->rank = sw->w;
	rep->world = vps_world_size(p->world);
	rep->transport = ex->car.name;
	vps_result_t rc = claim(ex, &ps, rep);
	if (!rc)
		rc = attach(ex, &ps, rep);
	if (!rc)
		rc = agree_training(ex, &ps, rep);
	if (!rc)
		rc = start(ex, &ps, rep);
	if (!rc)
		rc = verdict(ex, stages(ex, &ps, rep), rep);
	if (!rc)
		rc = digest(ex, &ps, rep);
	return report(ex, &ps, rc, rep);
}

/* ---- set-up and teardown ---- */

/* The transports of --transport, made once per executor (NCCL's
 * communicator too). The first is always made; a later one only when some
 * rank has a peer that the ones before it cannot reach, which the ranks
 * learn together (auto makes a communicator only where a switch crosses
 * nodes). */
static vps_result_t carriers_start(struct executor *ex)
{
	struct carriers *car = &ex->car;
	const struct vps_transport_choice *choice = vps_transport_choice(ex->o->transport);
	if (!choice)
		return vps_fail(VPS_EINPUT, "unknown transport %d", ex->o->transport);
	const struct vps_transport *const *list = choice->carriers;
	size_t n = 0;
	while (list[n])
		n++;
	uint64_t needed[VPS_TRANSPORT_MAX] = {1};
	for (size_t k = 0; k < ex->nplans; k++)
		for (size_t i = 0; i < ex->plans[k]->nxfers; i++) {
			const struct vps_peer_info *peer = &ex->peers[k][i];
			size_t j = 0;
			while (peer->rank >= 0 && j < n && !list[j]->can_connect(peer))
				j++;
			if (peer->rank >= 0 && j < n)
				needed[j] = 1;
		}
	if (n > 1)
		VPS_CHECK(vps_net_allreduce_sum(ex->net, needed + 1, n - 1, "transports"));
	struct vps_transport_env env = {ex->net, ex->net_rank, ex->net_world, ex->o->device, ex->o->local_rank};
	size_t made = 0;
	for (car->n = 0; car->n < n; car->n++) {
		const struct vps_transport *t = list[car->n];
		if (!needed[car->n])
			continue;
		VPS_CHECK(t->setup(&car->v[car->n].self, &env));
		car->v[car->n].t = t;
		car->name = made++ ? choice->label : t->name;
	}
	return VPS_OK;
}

/* A transport that may move GPU memory gets the CUDA context now, while
 * the trainer trains, not in the pause (host memory needs none: a machine
 * without a GPU goes on). */
static void gpu_context(struct executor *ex)
{
	bool wanted = false;
	for (size_t j = 0; j < ex->car.n; j++)
		wanted |= ex->car.v[j].t && ex->car.v[j].t->gpu_context;
	if (!wanted)
		return;
	const struct vps_cuda_api *api;
	int n = 0;
	char err[VPS_CUDA_ERR];
	if (!vps_gpu_api(&api) && !api->device_count(&n, err) && n > 0 &&
	    vps_gpu_init(ex->o->device, ex->o->local_rank, &api) == VPS_OK)
		ex->gpu = api;
	vps_clear_error();
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
		if (rc != VPS_ENOTFOUND && rc != VPS_ESTALE)
			return rc;
		double waited = now() - t0;
		if ((rc == VPS_ESTALE && waited > timeout) || (wait >= 0 && waited > wait))
			return rc;
		struct timespec ts = {0, 20000000};
		nanosleep(&ts, NULL);
	}
}

/* Plan k fits the first: the same devices, this rank's part, and a peer
 * map whose peers join this rank's mesh. */
static vps_result_t check_plan(struct executor *ex, size_t k)
{
	const struct vps_staged *s = ex->plans[k];
	int64_t W = vps_world_size(ex->p0->world);
	VPS_CHECK(vps_plan_check_hash(s->plan, "plan"));
	if (s->file_hash && s->file_hash != vps_staged_hash(s))
		return vps_fail(VPS_EINPUT, "staged plan %zu: its content does not hash to what it states", k + 1);
	int64_t w = vps_world_of_device(s->plan->world, ex->me);
	if (s->scope >= 0 && w != s->scope)
		return vps_fail(VPS_EINPUT, "staged plan %zu holds rank %" PRId64 "'s part, not this rank's", k + 1,
				s->scope);
	if (vps_world_size(s->plan->world) != W)
		return vps_fail(VPS_EINPUT, "staged plan %zu has a world of %" PRId64 ", the first %" PRId64, k + 1,
				vps_world_size(s->plan->world), W);
	if (w < 0)
		return vps_fail(VPS_EINPUT, "staged plan %zu does not use node %d gpu %d", k + 1, ex->me.node, ex->me.gpu);
	VPS_CHECK(peer_map(s, k, ex->p0, ex->me, w, &ex->peers[k]));
	for (size_t i = 0; i < s->nxfers; i++) {
		if (ex->peers[k][i].rank < 0)
			continue;
		VPS_CHECK(VPS_GROW(ex->mesh, ex->capmesh, ex->nmesh + 1));
		ex->mesh[ex->nmesh++] = ex->peers[k][i].rank;
	}
	uint64_t hk = vps_staged_world_hash(s);
	ex->hash = vps_hash64(&hk, sizeof(hk), ex->hash);
	return VPS_OK;
}

/* Everything that can be checked before a connection is made: this rank,
 * the token, every plan over the first plan's devices. */
static vps_result_t executor_check(struct executor *ex)
{
	const struct vps_exec_opts *o = ex->o;
	if (!ex->nplans)
		return vps_fail(VPS_EINPUT, "no staged plan");
	ex->p0 = ex->plans[0]->plan;
	int64_t W = vps_world_size(ex->p0->world);
	if (o->rank < 0 || o->rank >= W)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the transition world of %" PRId64, o->rank, W);
	if (W > 1 && (!o->token || strlen(o->token) < VPS_TOKEN_MIN))
		return vps_fail(VPS_EINPUT, "no job token: export VPS_TOKEN (vps-exec --new-token makes one) or pass --token-file;"
				" vps-exec(1) SECURITY");
	if (vps_lost_has_rank(&ex->p0->lost, o->rank))
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is a lost device of the plan: it has no part in the switch",
				o->rank);
	ex->me = vps_world_device(ex->p0->world, o->rank);
	ex->net_rank = net_rank(ex->p0, o->rank);
	ex->net_world = W - (int64_t)ex->p0->lost.nranks;
	ex->peers = vps_calloc(ex->nplans, sizeof(*ex->peers));
	if (!ex->peers)
		return VPS_ENOMEM;
	for (size_t k = 0; k < ex->nplans; k++)
		VPS_CHECK(check_plan(ex, k));
	/* the stages' all-reduce runs between XOR partners (vps_net_allreduce) */
	int64_t tree[64];
	size_t ntree = vps_net_tree_peers(ex->net_rank, ex->net_world, tree);
	for (size_t i = 0; i < ntree; i++) {
		VPS_CHECK(VPS_GROW(ex->mesh, ex->capmesh, ex->nmesh + 1));
		ex->mesh[ex->nmesh++] = tree[i];
	}
	return VPS_OK;
}

/* The trainer's registry, the network, the stages, the transports: all
 * before the trainer's request under --wait. */
static vps_result_t executor_start(struct executor *ex)
{
	const struct vps_exec_opts *o = ex->o;
	char name[VPS_REGISTRY_NAME_MAX + 32];
	VPS_CHECK(registry_name(o->registry, ex->p0, o->rank, o->local_rank, name, sizeof(name)));
	VPS_CHECK(open_registry(name, o->wait ? -1 : o->timeout, o->timeout, &ex->reg));
	struct vps_net_opts no = {ex->net_rank, ex->net_world, o->master_host, o->master_port, o->timeout, o->token,
				  o->bind,      ex->hash,      ex->mesh,       ex->nmesh};
	VPS_CHECK(vps_net_start(&ex->net, &no));
	VPS_CHECK(agree_stages(ex->net, ex->plans, ex->nplans));
	VPS_CHECK(vps_mapcache_new(&ex->maps));
	VPS_CHECK(carriers_start(ex));
	gpu_context(ex);
	vps_registry_state(ex->reg, &ex->last_seq);
	/* a request made before we attached counts */
	if (vps_registry_state(ex->reg, NULL) == VPS_REG_REQUESTED && ex->last_seq)
		ex->last_seq--;
	return VPS_OK;
}

/* rc: how the executor ends; a failure reaches the trainer. */
static void executor_release(struct executor *ex, vps_result_t rc)
{
	if (rc && ex->reg) {
		char msg[256];
		snprintf(msg, sizeof(msg), "rank %" PRId64 ": %s", ex->o->rank, vps_last_error());
		vps_registry_abort(ex->reg, msg);
	}
	carriers_free(&ex->car);
	vps_mapcache_free(ex->maps);
	vps_net_free(ex->net);
	vps_registry_close(ex->reg);
	free(ex->mesh);
	for (size_t k = 0; ex->peers && k < ex->nplans; k++)
		free(ex->peers[k]);
	free(ex->peers);
}

vps_result_t vps_exec_run(struct vps_staged *const *plans, size_t nplans, const struct vps_exec_opts *o,
			  struct vps_exec_report *reports)
{
	struct executor ex = {.o = o, .plans = plans, .nplans = nplans};
	vps_result_t rc = executor_check(&ex);
	double t_setup = now();
	if (!rc)
		rc = executor_start(&ex);
	double setup = now() - t_setup;
	for (size_t k = 0; k < nplans && !rc; k++) {
		memset(&reports[k], 0, sizeof(reports[k]));
		reports[k].setup_seconds = k ? 0 : setup;
		rc = one_switch(&ex, k, &reports[k]);
	}
	executor_release(&ex, rc);
	return rc;
}
