/* The executor: one rank's part of a job's switches (vps_exec_run). What
 * lasts across the switches of a --serve is one struct executor; each
 * switch is a sequence of named steps, from claiming the trainer's request
 * to reporting to it (one_switch). lib/exec/README.md, docs/exec.md. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "io/doc.h"
#include "exec/digest.h"
#include "exec/fault.h"
#include "gpu/gpu.h"
#include "registry/bell.h"
#include "util/hash.h"
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

/* After this many seconds a wait says, once, what it waits for. */
#define NOTICE_AFTER 3.0

static void notice(const struct vps_exec_opts *o, const char *fmt, ...)
{
	if (!o->notice)
		return;
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	o->notice(o->notice_ctx, msg);
}

/* Whether a wait that has lasted waited seconds speaks now: at
 * NOTICE_AFTER, then, where the caller asks for it (notice_every) and the
 * wait is bounded, every notice_every seconds; a wait without a limit (a
 * trainer that trains, under --wait) says it once. *next: when it speaks
 * next (0 to begin with, -1 never); so_far says how long, from the second
 * time on. */
static bool notice_due(const struct vps_exec_opts *o, double waited, bool bounded, double *next, char *so_far,
		       size_t n)
{
	if (*next < 0 || waited < (*next ? *next : NOTICE_AFTER))
		return false;
	if (*next)
		snprintf(so_far, n, ": %.0f s so far", waited);
	else if (n)
		so_far[0] = '\0';
	*next = bounded && o->notice_every > 0 ? waited + o->notice_every : -1;
	return true;
}

/* Plan k as messages name it: its file, where the caller gave the names. */
static const char *plan_name(const struct vps_exec_opts *o, size_t k, char *buf, size_t n)
{
	if (o->plan_names && o->plan_names[k])
		return o->plan_names[k];
	snprintf(buf, n, "staged plan %zu", k + 1);
	return buf;
}

/* ---- digest ---- */

vps_result_t vps_exec_digest(const struct vps_layout *l, int64_t rank, void *const *buffers, uint64_t *digest)
{
	return vps_exec_digest_part(l, rank, buffers, NULL, true, NULL, NULL, digest);
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
static vps_result_t peer_map(const struct vps_exec_opts *o, const struct vps_staged *s, size_t k,
			     const struct vps_plan *p0, struct vps_device me, int64_t w, struct vps_peer_info **out)
{
	char buf[32], first[32];
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
			rc = vps_fail(VPS_EINPUT, "%s uses a device that %s does not", plan_name(o, k, buf, sizeof(buf)),
				      plan_name(o, 0, first, sizeof(first)));
		else if (vps_lost_has_rank(&p0->lost, q))
			rc = vps_fail(VPS_EINPUT, "%s uses a device that %s lost", plan_name(o, k, buf, sizeof(buf)),
				      plan_name(o, 0, first, sizeof(first)));
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

/* A transfer that no transport of the one chosen reaches. */
static vps_result_t unreachable(const struct carriers *c, const struct vps_switch *sw, const struct vps_peer_info *peer)
{
	const char *reach = "";
	for (size_t j = 0; j < c->n; j++)
		if (c->v[j].t && c->v[j].t->reach)
			reach = c->v[j].t->reach;
	return vps_fail(VPS_EINPUT, "transport %s: rank %" PRId64 " exchanges with a device on node %d, and %s reaches %s",
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

/* Which transport carries each of this rank's transfers of the switch. */
static vps_result_t sort_switch(struct carriers *car, struct vps_switch *sw)
{
	const struct vps_staged *s = sw->s;
	for (size_t c = 0; c < car->n; c++)
		car->v[c].n = 0;
	for (size_t i = 0; i < s->nxfers; i++)
		if (sw->peers[i].rank >= 0)
			VPS_CHECK(carry(car, sw, &s->xfers[i]));
	return VPS_OK;
}

/* Every transport's begin with its transfers, in order (each may talk to
 * its peers). */
static vps_result_t begin_all(struct carriers *car, struct vps_switch *sw)
{
	VPS_CHECK(sort_switch(car, sw));
	for (size_t c = 0; c < car->n; c++)
		if (car->v[c].t && car->v[c].t->begin)
			VPS_CHECK(car->v[c].t->begin(car->v[c].self, sw, car->v[c].x, car->v[c].n));
	return VPS_OK;
}

/* Whether a transport of the list readies anything before the request. */
static bool any_prepare(const struct carriers *car)
{
	for (size_t c = 0; c < car->n; c++)
		if (car->v[c].t && car->v[c].t->prepare)
			return true;
	return false;
}

static vps_result_t prepare_all(struct carriers *car, struct vps_switch *sw)
{
	VPS_CHECK(sort_switch(car, sw));
	for (size_t c = 0; c < car->n; c++)
		if (car->v[c].t && car->v[c].t->prepare)
			VPS_CHECK(car->v[c].t->prepare(car->v[c].self, sw, car->v[c].x, car->v[c].n));
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
	double t_wait;                 /* waiting began (for the sources, or the request) */
	double asked_at;               /* wall clock: the trainer had asked before the transports
					* were readied (0: it had not), so their work was in the pause */
	double t_pause;
	struct vps_registry_training train;
	uint64_t digest[2];            /* this rank's part before and after (--check) */
	struct vps_buffer_desc transit; /* the transit area as node-mates map it (sw.transit_desc) */
	bool transit_linked;           /* its shared-memory object has a name yet (transit.shm_name) */
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

/* ---- the transit area ---- */

/* Its shared-memory object's name: the registry's, which this executor
 * alone holds, so a leftover of that name is a dead predecessor's. */
static void transit_name(const struct vps_switch *sw, char *out, size_t n)
{
	snprintf(out, n, "%s.area", vps_registry_name(sw->reg));
}

/* Unlink the area's object: node-mates that read it mapped it at begin,
 * and the mappings outlive the name, so from the start on nothing of it
 * can outlive the processes (a rank killed later leaves no object). */
static void transit_unlink(struct pass *ps)
{
	if (!ps->transit_linked)
		return;
	char path[sizeof(ps->transit.shm_name) + 1];
	snprintf(path, sizeof(path), "/%s", ps->transit.shm_name);
	shm_unlink(path);
	ps->transit_linked = false;
}

static void transit_free(struct pass *ps)
{
	struct vps_switch *sw = &ps->sw;
	transit_unlink(ps);
	if (sw->transit && sw->transit_where == VPS_WHERE_CUDA) {
		char err[VPS_CUDA_ERR];
		if (sw->gpu->release(sw->transit, err))
			vps_clear_error(); /* nothing to tell: the switch is over */
	} else if (sw->transit) {
		munmap(sw->transit, (size_t)sw->transit_bytes);
	}
	sw->transit = NULL;
	sw->transit_bytes = 0;
	sw->transit_desc = NULL;
}

/* Host memory for the area: a shared-memory object of this user, mode
 * 0600, where node-mates map it (shared), else private memory. Its pages
 * are reserved now, so a full /dev/shm fails here, not as a SIGBUS. */
static vps_result_t transit_host(struct pass *ps, bool shared, size_t bytes)
{
	struct vps_switch *sw = &ps->sw;
	if (!shared) {
		void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
		if (p == MAP_FAILED)
			return vps_fail_errno("transit area: map %zu bytes", bytes);
		sw->transit = p;
		return VPS_OK;
	}
	struct vps_buffer_desc *d = &ps->transit;
	char path[sizeof(d->shm_name) + 1];
	transit_name(sw, d->shm_name, sizeof(d->shm_name));
	snprintf(path, sizeof(path), "/%s", d->shm_name);
	int fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	if (fd < 0 && errno == EEXIST) {
		shm_unlink(path);
		fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
	}
	if (fd < 0)
		return vps_fail_errno("transit area: shared memory /dev/shm/%s", d->shm_name);
	ps->transit_linked = true;
	int err = ftruncate(fd, (off_t)bytes) ? errno : posix_fallocate(fd, 0, (off_t)bytes);
	void *p = err ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (!err && p == MAP_FAILED)
		err = errno;
	close(fd);
	if (err)
		return vps_fail(err == ENOSPC ? VPS_ENOMEM : VPS_ESYS, "transit area: shared memory /dev/shm/%s of %zu "
				"bytes: %s", d->shm_name, bytes, strerror(err));
	sw->transit = p;
	d->where = VPS_WHERE_HOST;
	d->buffer = VPS_BUFFER_TRANSIT | VPS_BUFFER_TARGET;
	d->offset = 0;
	d->bytes = bytes;
	sw->transit_desc = d;
	return VPS_OK;
}

/* The transit area of this rank, sized by the pieces of its plan that land
 * in it (every one of them is in a rank's own plan), where its targets are:
 * GPU memory when they are on the GPU (a CUDA IPC handle for node-mates),
 * else host memory. None when nothing lands in it. shared: a transport
 * that lets node-mates read it (ipc) is made. */
static vps_result_t transit_make(struct pass *ps, bool shared)
{
	struct vps_switch *sw = &ps->sw;
	int64_t bytes;
	VPS_CHECK(vps_plan_transit_bytes(sw->s->plan, sw->w, &bytes));
	sw->transit_where = sw->where == VPS_WHERE_CUDA ? VPS_WHERE_CUDA : VPS_WHERE_HOST;
	if (!bytes)
		return VPS_OK;
	if (bytes < 0 || (uint64_t)bytes > SIZE_MAX / 2 || (uint64_t)bytes > (uint64_t)INT64_MAX / 2)
		return vps_fail(VPS_EINPUT, "transit area: %" PRId64 " bytes", bytes);
	/* the planner aligns what lands in it to 64 bytes; a whole page keeps a
	 * mapping's end and the last arrival's alike */
	size_t len = (size_t)vps_round_up(bytes, 4096);
	if (sw->transit_where == VPS_WHERE_HOST) {
		VPS_CHECK(transit_host(ps, shared, len));
	} else {
		char err[VPS_CUDA_ERR] = "";
		void *p = NULL;
		VPS_GPU(sw->gpu->alloc(&p, len, err), "allocate the transit area");
		sw->transit = p;
		struct vps_buffer_desc *d = &ps->transit;
		uint64_t offset = 0, alloc = 0;
		int device = 0;
		if (shared) {
			int g = sw->gpu->ipc_handle(p, d->ipc, &offset, &alloc, &device, err);
			if (g) {
				sw->transit_bytes = (int64_t)len;
				return vps_gpu_result(g, err, "the transit area's IPC handle");
			}
			d->where = VPS_WHERE_CUDA;
			d->buffer = VPS_BUFFER_TRANSIT | VPS_BUFFER_TARGET;
			d->device = device;
			d->offset = offset;
			d->bytes = len;
			sw->transit_desc = d;
		}
	}
	sw->transit_bytes = (int64_t)len;
	return VPS_OK;
}

static void switch_release(struct vps_switch *sw)
{
	vps_rank_view_release(&sw->va);
	vps_rank_view_release(&sw->vb);
	free(sw->src);
	free(sw->dst);
	free(sw->src_entry);
	free(sw->dst_entry);
	free(sw->src_where);
	free(sw->dst_where);
	if (sw->maps)
		vps_mapcache_end_switch(sw->maps, sw->gpu);
}

/* Where the buffers of this switch live: all host, all GPU, or both
 * (VPS_WHERE_MIXED: map_side says each buffer's). */
static vps_result_t switch_where(struct vps_switch *sw, const struct vps_exec_opts *o)
{
	int where = -1;
	uint32_t n = vps_registry_num_entries(sw->reg);
	for (uint32_t i = 0; i < n; i++) {
		struct vps_registry_entry_info e;
		VPS_CHECK(vps_registry_entry(sw->reg, i, &e));
		where = where >= 0 && e.where != where ? VPS_WHERE_MIXED : e.where;
	}
	sw->where = where < 0 ? VPS_WHERE_HOST : where;
	if (sw->where != VPS_WHERE_HOST && !sw->gpu)
		VPS_CHECK(vps_gpu_init(o->device, o->local_rank, &sw->gpu));
	return VPS_OK;
}

static vps_result_t map_side(struct vps_switch *sw, const struct vps_rank_view *v, int role, void ***ptrs,
			     int64_t **entries, uint8_t **where)
{
	struct vps_registry *reg = sw->reg;
	*ptrs = vps_calloc(v->nbuffers + 1, sizeof(void *));
	*where = vps_calloc(v->nbuffers + 1, sizeof(**where));
	if (entries)
		*entries = vps_calloc(v->nbuffers + 1, sizeof(int64_t));
	if (!*ptrs || !*where || (entries && !*entries))
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
		(*where)[b] = (uint8_t)info.where;
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

/* Whether op's view on one side lies in what it names: a buffer of its
 * layout (sizes in bytes[0..n), NULL where this rank has no rank of that
 * layout) or the transit area (transit_bytes). */
static vps_result_t check_view(const struct vps_switch *sw, struct vps_op op, bool source, const int64_t *bytes,
			       size_t n, size_t i)
{
	uint32_t b = source ? vps_buffer_index(op.src_buffer) : op.dst_buffer;
	bool forward = op.src_buffer & VPS_BUFFER_TARGET;
	const int64_t *area = &sw->transit_bytes;
	if (source)
		op.src_buffer = b == VPS_BUFFER_TRANSIT ? 0 : b;
	else
		op.dst_buffer = b == VPS_BUFFER_TRANSIT ? 0 : b;
	if (b == VPS_BUFFER_TRANSIT)
		return source ? vps_check_op(&op, area, 1, NULL, 0) : vps_check_op(&op, NULL, 0, area, 1);
	if (!bytes)
		return vps_fail(VPS_EINPUT, "transfer %zu: rank %" PRId64 " %s without a %s layout rank", i, sw->w,
				source ? "sends" : "receives", source && !forward ? "source" : "target");
	return source ? vps_check_op(&op, bytes, n, NULL, 0) : vps_check_op(&op, NULL, 0, bytes, n);
}

/* Before a byte moves: every view this rank touches lies in its buffers,
 * or in its transit area. */
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
		int hop = x->nops ? vps_buffer_hop(s->ops[x->first_op].src_buffer) : 0;
		for (size_t q = 0; q < x->nops && !rc; q++) {
			const struct vps_op *op = &s->ops[x->first_op + q];
			if (vps_buffer_hop(op->src_buffer) != hop || hop < 0) {
				rc = vps_fail(VPS_EINPUT, "transfer %zu: its copies are not all of one hop (0 direct, 1 to "
					      "%d forwards)", i, VPS_MAX_HOP);
				break;
			}
			/* a relay's forwards are read from its target buffers (or its
			 * transit area), a direct piece from its sources */
			bool forward = op->src_buffer & VPS_BUFFER_TARGET;
			if (sends && forward)
				rc = check_view(sw, *op, true, sw->rb >= 0 ? db : NULL, sw->vb.nbuffers, i);
			else if (sends)
				rc = check_view(sw, *op, true, sw->ra >= 0 ? sb : NULL, sw->va.nbuffers, i);
			if (!rc && receives)
				rc = check_view(sw, *op, false, sw->rb >= 0 ? db : NULL, sw->vb.nbuffers, i);
		}
	}
done:
	free(sb);
	free(db);
	return rc;
}

/* The digest of a side, computed where its buffers are (on a GPU by a
 * kernel over them: nothing is read back). */
static vps_result_t side_digest(const struct vps_switch *sw, const struct vps_layout *l, int64_t rank, void **bufs,
				const uint8_t *where, uint64_t *digest)
{
	const struct vps_lost *lost = sw->s->plan->lost.nranks ? &sw->s->plan->lost : NULL;
	return vps_exec_digest_part(l, rank, bufs, lost, l == sw->s->plan->a, where, sw->gpu, digest);
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

/* The tests' fault (exec/fault.h): none unless the tests' executor set one. */
static struct {
	enum vps_exec_fault fault;
	int64_t stage;
} test_fault = {VPS_FAULT_NONE, -1};

void vps_exec_set_fault(enum vps_exec_fault fault, int64_t stage)
{
	test_fault.fault = fault;
	test_fault.stage = stage;
}

/* The tests' fault, if it strikes at stage (a stage or VPS_FAULT_AT_CLAIM). */
static void inject_fault(struct vps_registry *reg, struct vps_net *net, int64_t stage)
{
	if (test_fault.fault == VPS_FAULT_NONE || test_fault.stage != stage)
		return;
	if (test_fault.fault == VPS_FAULT_EXIT)
		_exit(3);
	if (test_fault.fault == VPS_FAULT_CUT) {
		vps_net_cut(net);
		return;
	}
	if (test_fault.fault == VPS_FAULT_STALL) {
		raise(SIGSTOP);
		return;
	}
	int pid = vps_registry_owner_pid(reg);
	if (pid > 0 && pid != getpid())
		kill(pid, SIGKILL);
	/* gone means gone to the watch: wait for the kernel to say so */
	for (int i = 0; i < 500 && vps_registry_owner_alive(reg); i++) {
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
}

/* The trainer's request, as the start of a switch waits for it
 * (vps_net_arrive): looked at when the registry's bell rings, and now and
 * then for what rings none. */
struct claim {
	struct vps_registry *reg;
	struct vps_net *net; /* for the tests' faults */
	uint32_t bell;       /* read before each look: a request after it rings */
	uint64_t after;
	double start, limit; /* limit < 0: wait as long as it takes (--wait) */
	uint64_t seq;
	bool claimed;
	double claimed_at;   /* wall clock */
	const struct vps_exec_opts *o;
	struct vps_mapcache *maps;
	const struct vps_cuda_api *gpu; /* GPU memory is opened ahead only with it */
	/* the switch's layouts: what the trainer registers for them is opened
	 * ahead, nothing it registered for another (which it may free) */
	uint64_t a_hash, b_hash;
	int64_t ra, rb;
	size_t nsources;     /* of this rank under A */
	double next_scan;
	bool warming;
	double notice_next;  /* when the wait says what it waits for (notice_due) */
};

static double wall_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An entry the trainer registered for this switch: a source under its
 * source layout, a target under its target layout. */
static bool for_this_switch(const struct claim *c, const struct vps_registry_entry_info *e)
{
	if (e->role == VPS_ROLE_SOURCE)
		return c->ra >= 0 && vps_registry_layout_hash(c->reg) == c->a_hash && vps_registry_rank(c->reg) == c->ra;
	return c->rb >= 0 && vps_registry_target_hash(c->reg) == c->b_hash && vps_registry_target_rank(c->reg) == c->rb;
}

/* While the trainer trains: map the host buffers it has registered and
 * read their pages once, a slice a poll, so that the first pass through
 * each mapping (slow on VMs, docs/exec.md) is not paid in the pause; open
 * the CUDA IPC handles of its GPU buffers for this switch, which costs
 * milliseconds each. What it no longer registers is unmapped (closed), so
 * that nothing it frees stays open here; GPU memory registered for another
 * switch is not opened at all (a trainer frees its old sources once the
 * switch before is done). Best effort: what fails here is found and
 * reported when the switch maps it. */
static void prefetch(struct claim *c)
{
	double t = now();
	if (t >= c->next_scan) {
		c->next_scan = t + 0.05;
		uint32_t n = vps_registry_num_entries(c->reg);
		struct vps_buffer_desc *reg = vps_calloc((size_t)n + 1, sizeof(*reg));
		size_t k = 0;
		for (uint32_t i = 0; reg && i < n; i++) {
			struct vps_registry_entry_info info;
			if (vps_registry_entry(c->reg, i, &info))
				continue;
			struct vps_buffer_desc *d = &reg[k++];
			d->where = (uint32_t)info.where;
			d->buffer = info.buffer;
			d->device = info.device;
			d->offset = info.offset;
			d->bytes = info.bytes;
			snprintf(d->shm_name, sizeof(d->shm_name), "%s", info.shm_name);
			memcpy(d->ipc, info.ipc_handle, sizeof(d->ipc));
			if (info.where == VPS_WHERE_HOST)
				vps_mapcache_prefetch(c->maps, NULL, d, info.role == VPS_ROLE_TARGET, false);
			else if (info.where == VPS_WHERE_CUDA && c->gpu && for_this_switch(c, &info))
				vps_mapcache_prefetch(c->maps, c->gpu, d, false, false);
		}
		if (reg)
			vps_mapcache_prune(c->maps, c->gpu, reg, k);
		free(reg);
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
	c->bell = vps_registry_bell(c->reg);
	vps_result_t rc = vps_registry_claim(c->reg, c->after, 0, &c->seq);
	if (!rc) {
		c->claimed = true;
		c->claimed_at = wall_now();
		inject_fault(c->reg, c->net, VPS_FAULT_AT_CLAIM);
		return 1;
	}
	if (rc != VPS_ETIMEOUT)
		return -1;
	vps_clear_error();
	if (c->maps)
		prefetch(c);
	char so_far[32];
	if (notice_due(c->o, now() - c->start, c->limit >= 0, &c->notice_next, so_far, sizeof(so_far)))
		notice(c->o, "waiting for the trainer (pid %d) of registry %s to request a switch%s",
		       vps_registry_owner_pid(c->reg), vps_registry_name(c->reg), so_far);
	if (c->limit >= 0 && now() - c->start > c->limit) {
		vps_fail(VPS_ETIMEOUT, "registry %s: no switch requested within %.1f s", vps_registry_name(c->reg), c->limit);
		return -1;
	}
	return 0;
}

static void await_trainer(void *ctx, double seconds)
{
	struct claim *c = ctx;
	vps_registry_await(c->reg, c->bell, seconds);
}

/* Before the request: the trainer has registered every source of this
 * switch (or asked for it already: then the attach says what is missing). */
static int registered_ready(void *ctx)
{
	struct claim *c = ctx;
	c->bell = vps_registry_bell(c->reg);
	if (!vps_registry_owner_alive(c->reg)) {
		vps_fail(VPS_EPEER, "registry %s: the trainer (pid %d) is gone", vps_registry_name(c->reg),
			 vps_registry_owner_pid(c->reg));
		return -1;
	}
	uint64_t seq;
	if (vps_registry_state(c->reg, &seq) == VPS_REG_REQUESTED && seq > c->after)
		return 1;
	if (c->ra < 0)
		return 1;
	bool all = vps_registry_layout_hash(c->reg) == c->a_hash && vps_registry_rank(c->reg) == c->ra;
	for (size_t b = 0; b < c->nsources && all; b++)
		all = vps_registry_find(c->reg, VPS_ROLE_SOURCE, (uint32_t)b) >= 0;
	if (all)
		return 1;
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
				int where;
				VPS_CHECK(vps_copy_where(op, vps_switch_src_where(sw, op->src_buffer),
							 vps_switch_dst_where(sw, op->dst_buffer), &where));
				(*retain)[(*nc)++] = (struct vps_local_copy){op, vps_switch_src(sw, op->src_buffer),
									     vps_switch_dst(sw, op->dst_buffer), where};
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

static bool is_forward(const struct vps_staged *s, const struct vps_xfer *x)
{
	return x->nops && x->first_op < s->nops && (s->ops[x->first_op].src_buffer & VPS_BUFFER_TARGET);
}

/* The relays on either side of this rank's forwards from transfer `from` on,
 * named in the error of a switch that failed before them: the relays it
 * was to hear from (upstream: a dead relay is named by each rank it would
 * have fed) and the ranks it was to pass on to (downstream), each with the
 * bytes still due. At most a few ranks each way, the rest counted. */
static void name_relays(const struct vps_switch *sw, size_t from)
{
	enum { SHOWN = 6 };
	const struct vps_staged *s = sw->s;
	for (int down = 0; down < 2; down++) {
		int64_t shown[SHOWN], bytes = 0, more = 0;
		size_t n = 0;
		for (size_t i = from; i < s->nxfers; i++) {
			const struct vps_xfer *x = &s->xfers[i];
			int64_t peer = down ? x->dst : x->src;
			if ((down ? x->src : x->dst) != sw->w || peer == sw->w || !is_forward(s, x))
				continue;
			for (size_t q = 0; q < x->nops; q++)
				bytes += vps_op_bytes(&s->ops[x->first_op + q]);
			size_t k = 0;
			while (k < n && shown[k] != peer)
				k++;
			if (k < n)
				continue;
			if (n < SHOWN)
				shown[n++] = peer;
			else
				more++; /* a peer past the shown ones may repeat: "at most" */
		}
		if (!n)
			continue;
		for (size_t k = 1; k < n; k++) /* in rank order */
			for (size_t m = k; m > 0 && shown[m - 1] > shown[m]; m--) {
				int64_t t = shown[m];
				shown[m] = shown[m - 1];
				shown[m - 1] = t;
			}
		char list[SHOWN * 24 + 48] = "", b[32];
		size_t at = 0;
		for (size_t k = 0; k < n && at < sizeof(list); k++)
			at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%" PRId64, k ? ", " : "", shown[k]);
		if (more && at < sizeof(list))
			snprintf(list + at, sizeof(list) - at, " and at most %" PRId64 " more", more);
		vps_format_bytes(bytes, b, sizeof(b));
		if (down)
			vps_error_suffix("rank %" PRId64 " was to pass on %s to rank%s %s (relay)", sw->w, b,
					 n > 1 || more ? "s" : "", list);
		else
			vps_error_suffix("%s of forwards still due to rank %" PRId64 " from relay%s %s", b, sw->w,
					 n > 1 || more ? "s" : "", list);
	}
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
		inject_fault(sw->reg, sw->net, (int64_t)st);
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
		if (rc) {
			name_relays(sw, i);
			break;
		}
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

/* What waiting for this rank's trainer polls: its registry, and what it
 * registered for this switch. */
static struct claim claim_of(const struct executor *ex, const struct pass *ps)
{
	const struct vps_exec_opts *o = ex->o;
	const struct vps_switch *sw = &ps->sw;
	const struct vps_plan *p = sw->s->plan;
	double window = (double)vps_max64((int64_t)o->request_timeout, (int64_t)o->timeout);
	return (struct claim){.reg = ex->reg,
			      .net = ex->net,
			      .after = ex->last_seq,
			      .start = ps->t_wait,
			      .limit = o->wait ? -1 : window,
			      .o = o,
			      .maps = ex->maps,
			      .gpu = ex->gpu,
			      .a_hash = vps_layout_hash(p->a),
			      .b_hash = vps_layout_hash(p->b),
			      .ra = sw->ra,
			      .rb = sw->rb};
}

/* Ready: what the transports can do before the request, while the
 * trainers train (ipc: map and open the peers' sources). The ranks first
 * wait, together, until every trainer has registered its sources (or
 * asked for the switch), as they wait for the request: heartbeats, and no
 * limit on how far apart the registrations come. */
static vps_result_t ready(struct executor *ex, struct pass *ps)
{
	struct vps_switch *sw = &ps->sw;
	if (!any_prepare(&ex->car) || ex->net_world < 2)
		return VPS_OK;
	const struct vps_plan *p = sw->s->plan;
	struct vps_rank_view va = {0};
	int64_t *entries = NULL;
	if (sw->ra >= 0)
		VPS_CHECK(vps_layout_rank(p->a, sw->ra, &va));
	struct claim c = claim_of(ex, ps);
	c.nsources = va.nbuffers;
	struct vps_net_trainer tr = {registered_ready, await_trainer, &c};
	vps_result_t rc = vps_net_arrive(ex->net, &tr, 1e30);
	if (!rc && !(entries = vps_calloc(va.nbuffers + 1, sizeof(*entries))))
		rc = VPS_ENOMEM;
	if (!rc) {
		bool mine = vps_registry_layout_hash(ex->reg) == c.a_hash && vps_registry_rank(ex->reg) == sw->ra;
		for (size_t b = 0; b < va.nbuffers; b++)
			entries[b] = mine ? vps_registry_find(ex->reg, VPS_ROLE_SOURCE, (uint32_t)b) : -1;
		struct vps_switch pre = *sw;
		pre.va = va;
		pre.src_entry = entries;
		pre.where = -1;
		double t = wall_now();
		vps_mapcache_take_opened(ex->maps);
		rc = prepare_all(&ex->car, &pre);
		/* a trainer that asked before this was done waited for it: the
		 * pause is counted from before it, and what it opened is the
		 * pause's (an overcount when the request came midway) */
		uint64_t seq;
		if (vps_registry_state(ex->reg, &seq) == VPS_REG_REQUESTED && seq > ex->last_seq)
			ps->asked_at = t;
	}
	free(entries);
	vps_rank_view_release(&va);
	return rc;
}

/* Claim: every rank's trainer has requested the switch. */
static vps_result_t claim(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	const struct vps_exec_opts *o = ex->o;
	/* a slow trainer is not a dead one (that one is seen at once): its
	 * request may take as long as the ranks' may lie apart */
	double window = (double)vps_max64((int64_t)o->request_timeout, (int64_t)o->timeout);
	struct claim c = claim_of(ex, ps);
	struct vps_net_trainer tr = {claim_ready, await_trainer, &c};
	vps_result_t rc = vps_net_arrive(ex->net, &tr, window);
	ps->claimed = c.claimed;
	ps->seq = c.seq;
	if (rc)
		return rc;
	ex->last_seq = c.seq;
	rep->switch_seq = c.seq;
	rep->requested_at = ps->asked_at ? ps->asked_at : c.claimed_at;
	rep->waited_seconds = now() - ps->t_wait;
	ps->t_pause = now();
	rep->started_at = wall_now();
	/* what the waiting mapped and opened is not the pause's */
	uint64_t before[2];
	vps_mapcache_take_stats(ex->maps, &before[0], &before[1]);
	if (!ps->asked_at)
		vps_mapcache_take_opened(ex->maps);
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
		VPS_CHECK(map_side(sw, &sw->va, VPS_ROLE_SOURCE, &sw->src, &sw->src_entry, &sw->src_where));
	}
	if (sw->rb >= 0) {
		VPS_CHECK(vps_layout_rank(p->b, sw->rb, &sw->vb));
		VPS_CHECK(map_side(sw, &sw->vb, VPS_ROLE_TARGET, &sw->dst, &sw->dst_entry, &sw->dst_where));
	}
	/* node-mates read the area where ipc carries their forwards */
	bool shared = false;
	for (size_t c = 0; c < ex->car.n; c++)
		shared |= ex->car.v[c].t == &vps_transport_ipc;
	VPS_CHECK(transit_make(ps, shared));
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
	rep->attach_seconds += now() - t;
	if (!rc && ex->o->check && sw->ra >= 0) {
		t = now();
		rc = side_digest(sw, sw->s->plan->a, sw->ra, sw->src, sw->src_where, &ps->digest[0]);
		rep->digest_seconds += now() - t;
	}
	rc = agree(ex, rc, "start", rep);
	/* every rank's begin is done: node-mates mapped the area */
	transit_unlink(ps);
	return rc;
}

/* The stages, then what this rank can tell of its part: its trainer
 * alive, its targets' digest. */
static vps_result_t stages(struct executor *ex, struct pass *ps, struct vps_exec_report *rep)
{
	struct vps_switch *sw = &ps->sw;
	VPS_CHECK(run_stages(sw, &ex->car, ex->o, rep));
	VPS_CHECK(trainer_watch(sw));
	if (ex->o->check && sw->rb >= 0) {
		double t = now();
		VPS_CHECK(side_digest(sw, sw->s->plan->b, sw->rb, sw->dst, sw->dst_where, &ps->digest[1]));
		rep->digest_seconds += now() - t;
	}
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

static void release(struct executor *ex, struct pass *ps)
{
	if (ps->begun)
		end_all(&ex->car, &ps->sw);
	/* the node-mates' mappings of the area are theirs: a host object lives
	 * until the last unmaps it; ipc closes a GPU area's handle before it
	 * says its last stage reading it is done */
	transit_free(ps);
	switch_release(&ps->sw);
}

/* Report to the trainer: done, with the training state to go on from, or
 * failed, and why. */
static vps_result_t report(struct executor *ex, struct pass *ps, vps_result_t rc, struct vps_exec_report *rep)
{
	if (ps->claimed)
		rep->opened_in_pause = vps_mapcache_take_opened(ex->maps);
	if (rc) {
		release(ex, ps);
		if (ps->claimed)
			vps_registry_finish(ex->reg, ps->seq, 0, vps_last_error());
		return rc;
	}
	/* every rank's verdict is in: no peer reads or writes through this
	 * rank's mappings any more, so the trainer goes on before they are
	 * let go (closing a CUDA IPC handle can take tens of milliseconds) */
	vps_registry_set_training(ex->reg, &ps->train);
	/* read before the verdict: once it rings, the trainer may run on this
	 * core first, and the executor's clocks would count its wake-up */
	rep->pause_seconds = now() - ps->t_pause;
	rep->done_at = wall_now();
	vps_registry_finish(ex->reg, ps->seq, 1, NULL);
	double t = now();
	release(ex, ps);
	rep->release_seconds = now() - t;
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
	ps.t_wait = now();
	struct vps_net_stats st;
	vps_net_stats(ex->net, &st);
	rep->data_connections = st.data_connections;
	rep->control_connections = st.control_connections;
	vps_result_t rc = ready(ex, &ps);
	if (!rc)
		rc = claim(ex, &ps, rep);
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
 * for the switch, so it costs the pause nothing. The forward steps of a
 * relayed plan take a second all-reduce, only when the first says some
 * rank forwards, and only of the hops some rank has: a plan without relays
 * pays nothing for them. */
static vps_result_t agree_stages(const struct executor *ex)
{
	struct vps_staged *const *plans = ex->plans;
	for (size_t k = 0; k < ex->nplans; k++) {
		int64_t *d;
		char what[64], buf[32];
		snprintf(what, sizeof(what), "stage boundaries of plan %zu", k + 1);
		VPS_CHECK(vps_staged_demand(plans[k], &d));
		size_t direct = VPS_DEMAND_COUNT(plans[k]->steps);
		vps_result_t rc = vps_net_allreduce(ex->net, d, direct, vps_stage_demand_combine, what);
		/* the hops come from every rank: bounded before they size a message */
		if (!rc && (VPS_DEMAND_HOPS(d) < 0 || VPS_DEMAND_HOPS(d) > VPS_MAX_HOP))
			rc = vps_fail(VPS_EINPUT, "%s: the world's demands say %" PRId64 " hops, not 0 to %d", what,
				      VPS_DEMAND_HOPS(d), VPS_MAX_HOP);
		if (!rc && VPS_DEMAND_HAS_FORWARDS(d)) {
			snprintf(what, sizeof(what), "forward stage boundaries of plan %zu", k + 1);
			rc = vps_net_allreduce(ex->net, d + direct,
					       VPS_DEMAND_FORWARD_AGREED(plans[k]->steps, VPS_DEMAND_HOPS(d)),
					       vps_stage_demand_combine, what);
		}
		if (!rc && (rc = vps_staged_cut(plans[k], d)))
			vps_error_prefix("%s", plan_name(ex->o, k, buf, sizeof(buf)));
		free(d);
		VPS_CHECK(rc);
	}
	return VPS_OK;
}

/* This rank's registry name: --registry, its job tag that of the first
 * plan's staging, as vps-trainer computes it. */
static vps_result_t registry_name(const struct executor *ex, char *out, size_t n)
{
	const struct vps_exec_opts *o = ex->o;
	struct vps_registry_name_parts parts = {vps_staged_world_hash(ex->plans[0]), o->rank,
						vps_world_a_rank(ex->p0->world, o->rank),
						vps_world_b_rank(ex->p0->world, o->rank), o->local_rank};
	return vps_registry_expand(o->registry ? o->registry : VPS_REGISTRY_DEFAULT, &parts, out, n);
}

/* Wait for the trainer's registry: absent or half made (the trainer has not
 * started) or stale (a crashed run's, which the trainer replaces when it
 * starts); at most --timeout, or under --wait as long as it takes (at most
 * its bound, --wait=S), but a stale one at most --timeout. One that another
 * executor holds is refused at once. */
static vps_result_t open_registry(const struct vps_exec_opts *o, const char *name, struct vps_registry **out)
{
	double t0 = now(), wait = !o->wait ? o->timeout : o->wait_limit > 0 ? o->wait_limit : -1, notice_next = 0;
	char so_far[32];
	for (;;) {
		vps_result_t rc = vps_registry_open(out, name);
		if (rc != VPS_ENOTFOUND && rc != VPS_ESTALE)
			return rc;
		double waited = now() - t0;
		if ((rc == VPS_ESTALE && waited > o->timeout) || (wait >= 0 && waited > wait)) {
			if (rc == VPS_ESTALE) {
				char stale[1024];
				snprintf(stale, sizeof(stale), "%s", vps_last_error());
				return vps_fail(rc, "%s, and no trainer replaced it within %.0f s", stale, waited);
			}
			if (o->wait)
				return vps_fail(VPS_ETIMEOUT, "no trainer has created registry %s (/dev/shm/%s) within %g s "
						"(--wait=%g): its trainer never started, or died first", name, name,
						o->wait_limit, o->wait_limit);
			return vps_fail(rc, "no trainer has created registry %s within %.0f s: is --registry the same for the "
					"trainer and vps-exec?", name, waited);
		}
		/* a stale one is waited for at most --timeout, even under --wait */
		if (notice_due(o, waited, wait >= 0 || rc == VPS_ESTALE, &notice_next, so_far, sizeof(so_far))) {
			if (rc == VPS_ESTALE)
				notice(o, "%s; waiting for a trainer to replace it%s", vps_last_error(), so_far);
			else
				notice(o, "waiting for a trainer to create registry %s (/dev/shm/%s)%s", name, name, so_far);
		}
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
	char buf[32], first[32];
	const char *name = plan_name(ex->o, k, buf, sizeof(buf));
	VPS_CHECK(vps_plan_check_hash(s->plan, name));
	if (s->file_hash && s->file_hash != vps_staged_hash(s))
		return vps_fail(VPS_EINPUT, "%s: its content does not hash to what it states (edited or damaged; vps-verify "
				"shows what is wrong)", name);
	int64_t w = vps_world_of_device(s->plan->world, ex->me);
	if (s->scope >= 0 && w != s->scope)
		return vps_fail(VPS_EINPUT, "%s holds rank %" PRId64 "'s part, not this rank's", name, s->scope);
	if (vps_world_size(s->plan->world) != W)
		return vps_fail(VPS_EINPUT, "%s has a world of %" PRId64 ", %s one of %" PRId64, name,
				vps_world_size(s->plan->world), plan_name(ex->o, 0, first, sizeof(first)), W);
	if (w < 0)
		return vps_fail(VPS_EINPUT, "%s does not use node %d gpu %d", name, ex->me.node, ex->me.gpu);
	VPS_CHECK(peer_map(ex->o, s, k, ex->p0, ex->me, w, &ex->peers[k]));
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
	char name[VPS_REGISTRY_NAME_MAX + 1];
	VPS_CHECK(registry_name(ex, name, sizeof(name)));
	VPS_CHECK(open_registry(o, name, &ex->reg));
	struct vps_net_opts no = {.rank = ex->net_rank,
				  .world = ex->net_world,
				  .master_host = o->master_host,
				  .master_port = o->master_port,
				  .timeout = o->timeout,
				  .token = o->token,
				  .bind = o->bind,
				  .plan_hash = ex->hash,
				  .peers = ex->mesh,
				  .npeers = ex->nmesh,
				  .notice = o->notice,
				  .notice_ctx = o->notice_ctx,
				  .notice_after = NOTICE_AFTER,
				  .notice_every = o->notice_every};
	VPS_CHECK(vps_net_start(&ex->net, &no));
	VPS_CHECK(agree_stages(ex));
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
	/* the other ranks learn why this one stops, wherever it stopped */
	if (rc)
		vps_net_abort(ex->net, vps_last_error());
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
	VPS_CHECK(VPS_OPTS_CHECK(o, VPS_EXEC_OPTS_VERSION, "struct vps_exec_opts", "VPS_EXEC_OPTS_INIT"));
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
