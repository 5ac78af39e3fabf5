#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "gpu/gpu.h"
#include "util/internal.h"
#include "vps/data.h"
#include "vps/registry.h"
#include "vps/trainer.h"

/* A rank's buffers. On the host they live in the registry's shared
 * memory; on a GPU in one cudaMalloc per shard, each buffer at an interior,
 * 256-byte aligned offset (as PyTorch's caching allocator hands them out),
 * with a host shadow that the pattern is written to and read back into. */
struct shard {
	struct vps_rank_view v;
	void **ptr;     /* what the pattern functions touch: host memory */
	void **dev;     /* GPU: the buffers' device addresses */
	void *alloc;    /* GPU: the one allocation, ours */
	void *borrowed; /* GPU: the one allocation, the caller's allocator's */
	char (*names)[VPS_REGISTRY_NAME_MAX + 8];
	const struct vps_cuda_api *gpu;
};

static void shard_release(struct shard *s)
{
	if (s->gpu) {
		char err[VPS_CUDA_ERR];
		for (size_t b = 0; b < s->v.nbuffers && s->ptr; b++)
			free(s->ptr[b]);
		if (s->alloc)
			s->gpu->release(s->alloc, err);
	}
	vps_rank_view_release(&s->v);
	free(s->ptr);
	free(s->dev);
	free(s->names);
	memset(s, 0, sizeof(*s));
}

/* Free a shard for good: its host buffers' objects too (every registry
 * entry naming them must be gone), so that a long run does not keep every
 * switch's sources. */
static vps_result_t shard_free(struct vps_registry *reg, struct shard *s)
{
	vps_result_t rc = VPS_OK;
	for (size_t b = 0; !s->gpu && s->ptr && b < s->v.nbuffers && !rc; b++)
		if (s->ptr[b])
			rc = vps_registry_free_host(reg, s->ptr[b]);
	shard_release(s);
	return rc;
}

static size_t buffer_bytes(const struct vps_buffer *b) { return (size_t)b->elements * vps_dtype_size(b->dtype); }

/* GPU: the shadow to the device, or back. */
static vps_result_t shard_sync(struct shard *s, bool to_device)
{
	for (size_t b = 0; b < s->v.nbuffers && s->gpu; b++) {
		size_t n = buffer_bytes(&s->v.buffers[b]);
		if (to_device)
			VPS_GPU(s->gpu->to_device(s->dev[b], s->ptr[b], n, gpu_err_), "trainer: write GPU state");
		else
			VPS_GPU(s->gpu->to_host(s->ptr[b], s->dev[b], n, gpu_err_), "trainer: read GPU state");
	}
	return VPS_OK;
}

/* Register a shard's buffers (again, after a reset, as sources). */
static vps_result_t register_shard(struct vps_registry *reg, struct shard *s, int role)
{
	for (size_t b = 0; b < s->v.nbuffers; b++) {
		const struct vps_buffer *buf = &s->v.buffers[b];
		if (s->gpu)
			VPS_CHECK(vps_registry_add_cuda_ptr(reg, role, (uint32_t)b, buf->state, buf->dtype, buf->elements,
							    s->dev[b]));
		else
			VPS_CHECK(vps_registry_add_host(reg, role, (uint32_t)b, buf->state, buf->dtype, buf->elements,
							s->names[b], 0));
	}
	return VPS_OK;
}

static vps_result_t alloc_gpu_shard(struct vps_registry *reg, const struct vps_cuda_api *gpu,
				    void *(*alloc)(void *, size_t), void *alloc_ctx, int role, struct shard *s)
{
	s->gpu = gpu;
	s->dev = vps_calloc(s->v.nbuffers + 1, sizeof(void *));
	if (!s->dev)
		return VPS_ENOMEM;
	size_t total = VPS_STAGE_ALIGN;
	for (size_t b = 0; b < s->v.nbuffers; b++)
		total += (size_t)vps_round_up((int64_t)buffer_bytes(&s->v.buffers[b]), VPS_STAGE_ALIGN);
	if (alloc) {
		void *p = alloc(alloc_ctx, total);
		if (!p)
			return vps_fail(VPS_ENOMEM, "trainer: the GPU allocator gave no %zu bytes", total);
		s->borrowed = p;
	} else {
		VPS_GPU(gpu->alloc(&s->alloc, total, gpu_err_), "trainer: allocate GPU state");
	}
	unsigned char *base = s->alloc ? s->alloc : s->borrowed;
	VPS_GPU(gpu->fill(base, 0, total, gpu_err_), "trainer: clear GPU state");
	size_t at = VPS_STAGE_ALIGN;
	for (size_t b = 0; b < s->v.nbuffers; b++) {
		size_t n = buffer_bytes(&s->v.buffers[b]);
		s->dev[b] = base + at;
		at += (size_t)vps_round_up((int64_t)n, VPS_STAGE_ALIGN);
		if (!(s->ptr[b] = calloc(n ? n : 1, 1)))
			return VPS_NOMEM();
	}
	return register_shard(reg, s, role);
}


static uint64_t view_bytes(const struct vps_rank_view *v)
{
	uint64_t n = 0;
	for (size_t b = 0; b < v->nbuffers; b++)
		n += buffer_bytes(&v->buffers[b]);
	return n;
}

/* What a rank's host buffers take of /dev/shm (none for rank -1). */
static vps_result_t rank_bytes(const struct vps_layout *l, int64_t rank, uint64_t *out)
{
	*out = 0;
	if (rank < 0)
		return VPS_OK;
	struct vps_rank_view v;
	VPS_CHECK(vps_layout_rank(l, rank, &v));
	*out = view_bytes(&v);
	vps_rank_view_release(&v);
	return VPS_OK;
}

/* Before anything is made: /dev/shm holds the first switch's sources and
 * targets at once, and a /dev/shm too small is said with that whole need
 * (each shard's allocation checks its own part again, and reserves it). */
static vps_result_t check_room(const struct vps_plan *p0, int64_t ra, int64_t rb)
{
	uint64_t a, b;
	VPS_CHECK(rank_bytes(p0->a, ra, &a));
	VPS_CHECK(rank_bytes(p0->b, rb, &b));
	return vps_registry_check_room(a + b);
}

/* Allocate every buffer of a rank view in the registry. */
static vps_result_t alloc_shard(struct vps_registry *reg, const struct vps_layout *l, int64_t rank, int role,
				const struct vps_cuda_api *gpu, const struct vps_trainer_opts *o, struct shard *s)
{
	VPS_CHECK(vps_layout_rank(l, rank, &s->v));
	s->ptr = vps_calloc(s->v.nbuffers + 1, sizeof(void *));
	s->names = vps_calloc(s->v.nbuffers + 1, sizeof(*s->names));
	if (!s->ptr || !s->names)
		return VPS_ENOMEM;
	if (gpu)
		return alloc_gpu_shard(reg, gpu, o->cuda_alloc, o->cuda_alloc_ctx, role, s);
	VPS_CHECK(vps_registry_check_room(view_bytes(&s->v)));
	for (size_t b = 0; b < s->v.nbuffers; b++) {
		const struct vps_buffer *buf = &s->v.buffers[b];
		VPS_CHECK(vps_registry_alloc_host(reg, role, (uint32_t)b, buf->state, buf->dtype, buf->elements, &s->ptr[b]));
		/* a trainer's memory is backed before a switch (GPU memory is) */
		memset(s->ptr[b], 0, (size_t)buf->elements * vps_dtype_size(buf->dtype));
		struct vps_registry_entry_info e;
		VPS_CHECK(vps_registry_entry(reg, vps_registry_num_entries(reg) - 1, &e));
		snprintf(s->names[b], sizeof(s->names[b]), "%s", e.shm_name);
	}
	return VPS_OK;
}

/* The fake optimizer step: every state of every region becomes the
 * pattern of that step. */
static vps_result_t fill_shard(const struct vps_layout *l, struct shard *s, int64_t step)
{
	for (size_t i = 0; i < s->v.nregions; i++) {
		const struct vps_region *r = &s->v.regions[i];
		struct vps_tensor t;
		vps_model_tensor(vps_layout_model(l), r->tensor, &t);
		vps_fill_region(s->ptr[r->buffer], r, &t, step);
	}
	return shard_sync(s, true);
}

/* Elements of region r outside the lost ranges (holes a plan around lost
 * devices leaves for the trainer to reload), checked against the pattern. */
static vps_result_t check_survived(void *buf, const struct vps_region *r, const struct vps_tensor *t, int64_t step,
				   const struct vps_lost *holes, int64_t *wrong)
{
	struct vps_boxes rem = {0}, scratch = {0};
	vps_result_t rc = vps_boxes_reset(&rem, &r->box);
	for (size_t k = 0; holes && k < holes->nranges && rem.n && !rc; k++) {
		const struct vps_lost_range *x = &holes->ranges[k];
		if (x->tensor == r->tensor && x->state == r->state)
			rc = vps_boxes_subtract(&rem, &scratch, &x->box);
	}
	for (size_t j = 0; j < rem.n && !rc; j++) {
		struct vps_region part;
		vps_region_restrict(r, &rem.v[j], &part);
		*wrong += vps_check_region(buf, &part, t, step);
	}
	vps_boxes_release(&rem);
	vps_boxes_release(&scratch);
	return rc;
}

static vps_result_t check_shard(const struct vps_layout *l, struct shard *s, int64_t step, int64_t *wrong,
				int64_t *dirty, const struct vps_lost *holes)
{
	VPS_CHECK(shard_sync(s, false));
	for (size_t i = 0; i < s->v.nregions; i++) {
		const struct vps_region *r = &s->v.regions[i];
		struct vps_tensor t;
		vps_model_tensor(vps_layout_model(l), r->tensor, &t);
		if (holes && holes->nranges)
			VPS_CHECK(check_survived(s->ptr[r->buffer], r, &t, step, holes, wrong));
		else
			*wrong += vps_check_region(s->ptr[r->buffer], r, &t, step);
	}
	/* padding (vocabulary rows, alignment, bucket ends) stays zero */
	for (size_t b = 0; b < s->v.nbuffers; b++) {
		size_t es = vps_dtype_size(s->v.buffers[b].dtype);
		int64_t el = s->v.buffers[b].elements;
		unsigned char *covered = calloc((size_t)el + 1, 1);
		if (!covered)
			continue;
		for (size_t i = 0; i < s->v.nregions; i++) {
			const struct vps_region *r = &s->v.regions[i];
			if (r->buffer != b)
				continue;
			int64_t first, end;
			vps_region_extent(r, &first, &end);
			memset(covered + first, 1, (size_t)(end - first));
		}
		const unsigned char *p = s->ptr[b];
		for (int64_t e = 0; e < el; e++)
			if (!covered[e])
				for (size_t k = 0; k < es; k++)
					if (p[(size_t)e * es + k]) {
						(*dirty)++;
						break;
					}
		free(covered);
	}
	return VPS_OK;
}

/* Megatron's pretraining sampler: in a step starting at `consumed`,
 * data-parallel rank d reads, for each micro-batch m, samples
 * consumed + m * (mbs * dp) + d * mbs + [0, mbs). Only the data-loading ranks
 * (tp 0 of the first pipeline stage) log, and of those only cp 0: the CP
 * ranks of a DP rank read the same samples, each a part of their sequence. */
static vps_result_t take_step(const struct vps_layout *l, int64_t rank, const struct vps_registry_training *t,
			      FILE *log)
{
	if (!log || t->global_batch <= 0)
		return VPS_OK;
	struct vps_coords c;
	vps_layout_coords(l, rank, &c);
	if (c.tp != 0 || c.cp != 0 || c.pp != 0)
		return VPS_OK;
	for (int64_t m = 0; m < t->grad_accum; m++)
		for (int64_t i = 0; i < t->micro_batch; i++)
			if (fprintf(log, "%" PRId64 "\n",
				    t->consumed_samples + m * t->micro_batch * t->dp + c.dp * t->micro_batch + i) < 0)
				return vps_fail_errno("samples log");
	/* a step is logged when it is taken: the log shows how far a run is */
	if (fflush(log) != 0)
		return vps_fail_errno("samples log");
	return VPS_OK;
}

/* One trainer: its registry, its shards (the source it holds, the target
 * a switch fills), its training state and its samples log. */
struct trainer {
	const struct vps_trainer_opts *o;
	struct vps_registry *reg;
	const struct vps_cuda_api *gpu;
	struct shard src, dst;
	struct vps_registry_training t;
	FILE *log;
	struct vps_device me;
};

/* Plan k as messages name it: its file, where the caller gave the names. */
static const char *plan_name(const struct vps_trainer_opts *o, size_t k, char *buf, size_t n)
{
	if (o->plan_names && o->plan_names[k])
		return o->plan_names[k];
	snprintf(buf, n, "staged plan %zu", k + 1);
	return buf;
}

/* The plans chain (each starts where the one before ends) and hold this
 * rank. */
static vps_result_t check_plans(struct vps_staged *const *plans, size_t nplans, const struct vps_trainer_opts *o)
{
	int64_t rank = o->rank;
	if (!nplans)
		return vps_fail(VPS_EINPUT, "no staged plan");
	for (size_t k = 0; k < nplans; k++) {
		char buf[32], before[32];
		const char *name = plan_name(o, k, buf, sizeof(buf));
		VPS_CHECK(vps_plan_check_hash(plans[k]->plan, name));
		if (plans[k]->file_hash && plans[k]->file_hash != vps_staged_hash(plans[k]))
			return vps_fail(VPS_EINPUT, "%s: its content does not hash to what it states (edited or damaged; "
					"vps-verify shows what is wrong)", name);
		if (k && vps_layout_hash(plans[k]->plan->a) != vps_layout_hash(plans[k - 1]->plan->b))
			return vps_fail(VPS_EINPUT, "%s does not start from the layout %s ends in", name,
					plan_name(o, k - 1, before, sizeof(before)));
	}
	const struct vps_plan *p0 = plans[0]->plan;
	if (rank < 0 || rank >= vps_world_size(p0->world))
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the transition world of %" PRId64, rank,
				vps_world_size(p0->world));
	return VPS_OK;
}

/* Before switch k (plan p) is asked for, and before the steps that lead
 * to it: the state held becomes the sources (after the first switch: the
 * last targets), and the targets are allocated and registered, so that the
 * executor opens them while this trainer trains, not in the pause. */
static vps_result_t ready_switch(struct trainer *tr, const struct vps_plan *p, size_t k)
{
	int64_t w = vps_world_of_device(p->world, tr->me);
	char buf[32];
	if (w < 0)
		return vps_fail(VPS_EINPUT, "%s does not use this device", plan_name(tr->o, k, buf, sizeof(buf)));
	int64_t a = vps_world_a_rank(p->world, w), b = vps_world_b_rank(p->world, w);
	if (k > 0) {
		VPS_CHECK(vps_registry_reset(tr->reg, vps_layout_hash(p->a), a));
		VPS_CHECK(shard_free(tr->reg, &tr->src));
		if (a >= 0) {
			tr->src = tr->dst;
			memset(&tr->dst, 0, sizeof(tr->dst));
			VPS_CHECK(register_shard(tr->reg, &tr->src, VPS_ROLE_SOURCE));
		}
	}
	if (b >= 0)
		VPS_CHECK(alloc_shard(tr->reg, p->b, b, VPS_ROLE_TARGET, tr->gpu, tr->o, &tr->dst));
	return vps_registry_set_target(tr->reg, vps_layout_hash(p->b), b);
}

/* The registry, the first training state, the first switch's targets, and
 * the source shard trained for steps_before steps. */
static vps_result_t trainer_start(struct trainer *tr, const struct vps_plan *p0)
{
	const struct vps_trainer_opts *o = tr->o;
	struct vps_registry_training *t = &tr->t;
	int64_t ra = vps_world_a_rank(p0->world, o->rank);
	if (o->cuda)
		VPS_CHECK(vps_gpu_init(o->device, o->local_rank, &tr->gpu));
	else
		VPS_CHECK(check_room(p0, ra, vps_world_b_rank(p0->world, o->rank)));
	VPS_CHECK(vps_registry_create(&tr->reg, o->registry, ra >= 0 ? vps_layout_hash(p0->a) : 0, ra,
				      (uint32_t)(4 * VPS_NSTATES * 64), 1));
	t->global_batch = o->global_batch;
	t->dp = vps_layout_parallel(p0->a)->dp;
	t->micro_batch = o->micro_batch > 0 ? o->micro_batch : 1;
	if (t->global_batch) {
		if (t->global_batch % (t->micro_batch * t->dp))
			return vps_fail(VPS_EINPUT, "global batch %" PRId64 " is not a multiple of micro batch %" PRId64
					" x dp %" PRId64, t->global_batch, t->micro_batch, t->dp);
		t->grad_accum = t->global_batch / (t->micro_batch * t->dp);
	}
	if (ra >= 0) {
		VPS_CHECK(alloc_shard(tr->reg, p0->a, ra, VPS_ROLE_SOURCE, tr->gpu, o, &tr->src));
		VPS_CHECK(fill_shard(p0->a, &tr->src, 0));
	}
	VPS_CHECK(ready_switch(tr, p0, 0));
	if (ra >= 0) {
		for (int64_t s = 1; s <= o->steps_before; s++) {
			VPS_CHECK(take_step(p0->a, ra, t, tr->log));
			t->consumed_samples += t->global_batch;
			t->step = t->scheduler_step = s;
			VPS_CHECK(fill_shard(p0->a, &tr->src, s));
		}
	}
	t->valid = 1;
	vps_registry_set_training(tr->reg, t);
	return VPS_OK;
}

/* After this many seconds the wait for the executor says, once, what it
 * waits for. */
#define NOTICE_AFTER 3.0

/* Wait for switch seq, saying early what it waits for: a trainer whose
 * executor never comes (another --registry, no vps-exec) would otherwise
 * be silent for the whole timeout. */
static vps_result_t wait_switch(struct trainer *tr, uint64_t seq)
{
	const struct vps_trainer_opts *o = tr->o;
	double timeout = o->timeout;
	if (!o->notice || (timeout >= 0 && timeout <= NOTICE_AFTER))
		return vps_registry_wait(tr->reg, seq, timeout);
	vps_result_t rc = vps_registry_wait(tr->reg, seq, NOTICE_AFTER);
	if (rc != VPS_ETIMEOUT)
		return rc;
	char what[256], msg[512];
	vps_registry_describe(tr->reg, what, sizeof(what));
	snprintf(msg, sizeof(msg), "waiting for switch %" PRIu64 " in registry %s: %s", seq, vps_registry_name(tr->reg),
		 what);
	o->notice(o->notice_ctx, msg);
	vps_clear_error();
	rc = vps_registry_wait(tr->reg, seq, timeout < 0 ? -1 : timeout - NOTICE_AFTER);
	if (rc == VPS_ETIMEOUT) {
		vps_registry_describe(tr->reg, what, sizeof(what));
		return vps_fail(rc, "registry %s: switch %" PRIu64 " not done after %.1f s: %s", vps_registry_name(tr->reg),
				seq, timeout, what);
	}
	return rc;
}

/* A failed switch must leave the sources as they were: say whether it did. */
static vps_result_t switch_failed(struct trainer *tr, const struct vps_plan *p, int64_t a, vps_result_t rc)
{
	int64_t wrong = 0, dirty = 0;
	char msg[1024];
	snprintf(msg, sizeof(msg), "%s", vps_last_error());
	if (a >= 0)
		if (check_shard(p->a, &tr->src, tr->t.step, &wrong, &dirty, NULL))
			wrong = -1;
	return vps_fail(rc, "%s; sources %s", msg,
			a < 0 ? "none (joining)" : wrong < 0 ? "unreadable" : wrong || dirty ? "DAMAGED" : "intact");
}

/* After a switch to target rank b: the state received is checked, the
 * next switch (plan `next`, number k, NULL: none) readied, and training
 * goes on from the step and data position the switch carried (rank 0's: a
 * joining device had none of its own). */
static vps_result_t train_on(struct trainer *tr, const struct vps_plan *p, int64_t a, int64_t b,
			     const struct vps_plan *next, size_t k, struct vps_trainer_result *res)
{
	struct vps_registry_training *t = &tr->t;
	int64_t step_before = t->step, consumed_before = t->consumed_samples;
	vps_registry_get_training(tr->reg, t);
	if (!t->valid || (a >= 0 && (t->step != step_before || t->consumed_samples != consumed_before)))
		res->training_state_ok = false;
	VPS_CHECK(check_shard(p->b, &tr->dst, t->step, &res->wrong_elements, &res->dirty_padding, &p->lost));
	if (next)
		VPS_CHECK(ready_switch(tr, next, k));
	/* the state: the next switch's sources once it is readied */
	struct shard *state = next && tr->src.ptr ? &tr->src : &tr->dst;
	for (int64_t s = 1; s <= tr->o->steps_after; s++) {
		VPS_CHECK(take_step(p->b, b, t, tr->log));
		t->consumed_samples += t->global_batch;
		t->step++;
		t->scheduler_step++;
		VPS_CHECK(fill_shard(p->b, state, t->step));
	}
	vps_registry_set_training(tr->reg, t);
	return VPS_OK;
}

/* Switch k, readied: asked for and waited for, then training goes on
 * toward the next (plan `next`, NULL: none). */
static vps_result_t one_switch(struct trainer *tr, const struct vps_staged *s, size_t k, const struct vps_plan *next,
			       struct vps_trainer_result *res)
{
	const struct vps_plan *p = s->plan;
	int64_t w = vps_world_of_device(p->world, tr->me);
	int64_t a = vps_world_a_rank(p->world, w), b = vps_world_b_rank(p->world, w);
	uint64_t seq;
	vps_result_t rc = vps_registry_request(tr->reg, &seq);
	if (!rc)
		rc = wait_switch(tr, seq);
	if (rc)
		return switch_failed(tr, p, a, rc);
	res->switches++;
	if (b >= 0)
		return train_on(tr, p, a, b, next, k + 1, res);
	/* a leaving device holds nothing now; it may join a later switch */
	VPS_CHECK(vps_registry_reset(tr->reg, 0, -1));
	VPS_CHECK(shard_free(tr->reg, &tr->src));
	return next ? ready_switch(tr, next, k + 1) : VPS_OK;
}

vps_result_t vps_trainer_run(struct vps_staged *const *plans, size_t nplans, const struct vps_trainer_opts *o,
			     struct vps_trainer_result *res)
{
	struct trainer tr = {.o = o};
	memset(res, 0, sizeof(*res));
	res->training_state_ok = true;
	VPS_CHECK(VPS_OPTS_CHECK(o, VPS_TRAINER_OPTS_VERSION, "struct vps_trainer_opts", "VPS_TRAINER_OPTS_INIT"));
	VPS_CHECK(check_plans(plans, nplans, o));
	const struct vps_plan *p0 = plans[0]->plan;
	tr.me = vps_world_device(p0->world, o->rank);
	if (o->samples_log && !(tr.log = fopen(o->samples_log, "a")))
		return vps_fail(VPS_EINPUT, "%s: %s", o->samples_log, strerror(errno));
	vps_result_t rc = trainer_start(&tr, p0);
	for (size_t k = 0; k < nplans && !rc; k++)
		rc = one_switch(&tr, plans[k], k, k + 1 < nplans ? plans[k + 1]->plan : NULL, res);
	if (!rc) {
		res->step = tr.t.step;
		res->consumed_samples = tr.t.consumed_samples;
	}
	if (tr.log && fclose(tr.log) != 0 && !rc)
		rc = vps_fail_errno("samples log");
	shard_release(&tr.src);
	shard_release(&tr.dst);
	vps_registry_close(tr.reg);
	return rc;
}
