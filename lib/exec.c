/* One rank of a switch: registry, rendezvous, stages, digest, report. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "doc.h"
#include "internal.h"
#include "net.h"
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
			return vps_fail(VPS_EINPUT, "--registry: unknown '%%%c' in '%s' (%%r, %%a, %%b, %%l)", *c, pattern);
		}
		len += (size_t)snprintf(out + len, n - len, "%" PRId64, v);
	}
	out[len] = '\0';
	return VPS_OK;
}

/* ---- digest ---- */

vps_result_t vps_exec_digest(const struct vps_layout *l, int64_t rank, void *const *buffers, uint64_t *digest)
{
	struct vps_rank_view v;
	struct vps_holders h = {0};
	struct vps_box *rem = NULL, *next = NULL;
	size_t cap_r = 0, cap_n = 0;
	uint64_t sum = 0;
	vps_result_t rc;
	VPS_CHECK(vps_layout_rank(l, rank, &v));
	for (size_t i = 0; i < v.nregions; i++) {
		const struct vps_region *R = &v.regions[i];
		struct vps_tensor t;
		VPS_CHECK_GOTO(vps_model_tensor(vps_layout_model(l), R->tensor, &t), rc, done);
		h.n = 0;
		VPS_CHECK_GOTO(vps_layout_holders(l, R->tensor, R->state, &R->box, &h), rc, done);
		/* count only what no lower-numbered rank holds */
		size_t nrem = 1;
		VPS_CHECK_GOTO(VPS_GROW(rem, cap_r, 1), rc, done);
		rem[0] = R->box;
		for (size_t k = 0; k < h.n && nrem; k++) {
			if (h.v[k].base >= rank)
				continue;
			size_t nn = 0;
			for (size_t j = 0; j < nrem; j++) {
				struct vps_box out[2 * VPS_MAX_DIMS];
				int m = vps_box_subtract(&rem[j], &h.v[k].region.box, out);
				if (!m)
					continue;
				VPS_CHECK_GOTO(VPS_GROW(next, cap_n, nn + (size_t)m), rc, done);
				memcpy(next + nn, out, (size_t)m * sizeof(*out));
				nn += (size_t)m;
			}
			struct vps_box *t2 = rem;
			size_t c2 = cap_r;
			rem = next;
			cap_r = cap_n;
			next = t2;
			cap_n = c2;
			nrem = nn;
		}
		for (size_t j = 0; j < nrem; j++) {
			struct vps_region part;
			vps_region_restrict(R, &rem[j], &part);
			sum += vps_digest_region(buffers[R->buffer], &part, &t);
		}
	}
	*digest = sum;
	rc = VPS_OK;
done:
	free(rem);
	free(next);
	vps_holders_release(&h);
	vps_rank_view_release(&v);
	return rc;
}

/* ---- one switch ---- */

struct attach {
	int64_t w, ra, rb;
	struct vps_rank_view va, vb;
	void **src, **dst;
	int64_t *src_entry;
};

static void attach_release(struct attach *a)
{
	vps_rank_view_release(&a->va);
	vps_rank_view_release(&a->vb);
	free(a->src);
	free(a->dst);
	free(a->src_entry);
	memset(a, 0, sizeof(*a));
}

static vps_result_t map_side(struct vps_registry *reg, const struct vps_rank_view *v, int role, void ***ptrs,
			     int64_t **entries)
{
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
		VPS_CHECK(vps_registry_map(reg, (uint32_t)e, role == VPS_ROLE_TARGET, &(*ptrs)[b]));
		if (entries)
			(*entries)[b] = e;
	}
	return VPS_OK;
}

static void rowmajor(const struct vps_op *o, int64_t *st)
{
	int64_t s = 1;
	for (int k = o->ndim - 1; k >= 0; k--) {
		st[k] = s;
		s *= o->ext[k];
	}
}

static uint64_t xfer_tag(const struct vps_xfer *x)
{
	return ((uint64_t)x->stage << 40) ^ ((uint64_t)x->step << 16) ^ (uint64_t)x->chunk;
}

/* The training scalars of world rank 0's trainer, and the target's split. */
static vps_result_t share_training(struct vps_net *net, const struct vps_staged *s, int64_t w,
				   struct vps_registry *reg, struct vps_registry_training *t)
{
	struct vps_registry_training mine;
	memset(t, 0, sizeof(*t));
	vps_registry_get_training(reg, &mine);
	uint64_t v[8] = {0};
	if (w == 0 && mine.valid) {
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

/* The op's elements in row-major order of its extents, as iovecs over a
 * view (element offset, strides) of a buffer: one per row, merged when rows
 * touch. Returns false when the innermost axis is strided. */
static bool view_rows(unsigned char *buf, int64_t offset, const int64_t *strides, const struct vps_op *op,
		      struct iovs *out, vps_result_t *rc)
{
	int last = op->ndim - 1;
	if (strides[last] != 1 && op->ext[last] != 1)
		return false;
	int64_t rows = 1, idx[VPS_MAX_DIMS] = {0};
	for (int k = 0; k < last; k++)
		rows *= op->ext[k];
	size_t len = (size_t)op->ext[last] * op->esize;
	for (int64_t r = 0; r < rows; r++) {
		int64_t off = offset;
		for (int k = 0; k < last; k++)
			off += idx[k] * strides[k];
		if ((*rc = iov_push(out, buf + off * op->esize, len)))
			return true;
		for (int k = last - 1; k >= 0; k--) {
			if (++idx[k] < op->ext[k])
				break;
			idx[k] = 0;
		}
	}
	return true;
}

/* The wire stream of a transfer is its ops' bytes in order, each op's in
 * row-major order of its extents. The sender gathers them straight from its
 * source buffers and the receiver scatters them straight into its
 * destination buffers; an op strided on its innermost axis goes through a
 * bounce buffer (packed before, unpacked after). */
static vps_result_t transfer_iovs(const struct vps_staged *s, const struct vps_xfer *x, bool sending, void **bufs,
				  struct iovs *out, unsigned char **bounce, size_t *bounce_len)
{
	size_t need = 0;
	for (size_t q = 0; q < x->nops; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		const int64_t *st = sending ? op->src_strides : op->dst_strides;
		if (st[op->ndim - 1] != 1 && op->ext[op->ndim - 1] != 1)
			need += (size_t)vps_op_bytes(op);
	}
	*bounce = NULL;
	*bounce_len = need;
	if (need && !(*bounce = malloc(need)))
		return VPS_NOMEM();
	size_t at = 0;
	for (size_t q = 0; q < x->nops; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		vps_result_t rc = VPS_OK;
		unsigned char *buf = bufs[sending ? op->src_buffer : op->dst_buffer];
		if (view_rows(buf, sending ? op->src_offset : op->dst_offset, sending ? op->src_strides : op->dst_strides, op,
			      out, &rc)) {
			if (rc)
				return rc;
			continue;
		}
		int64_t flat[VPS_MAX_DIMS];
		rowmajor(op, flat);
		if (sending)
			vps_copy_strided(*bounce + at, flat, buf + op->src_offset * op->esize, op->src_strides, op->ext,
					 op->ndim, op->esize);
		VPS_CHECK(iov_push(out, *bounce + at, (size_t)vps_op_bytes(op)));
		at += (size_t)vps_op_bytes(op);
	}
	return VPS_OK;
}

/* After a receive: ops that came through the bounce buffer go in place. */
static void unbounce(const struct vps_staged *s, const struct vps_xfer *x, void **bufs, unsigned char *bounce)
{
	size_t at = 0;
	for (size_t q = 0; q < x->nops && bounce; q++) {
		const struct vps_op *op = &s->ops[x->first_op + q];
		if (op->dst_strides[op->ndim - 1] == 1 || op->ext[op->ndim - 1] == 1)
			continue;
		int64_t flat[VPS_MAX_DIMS];
		rowmajor(op, flat);
		vps_copy_strided((unsigned char *)bufs[op->dst_buffer] + op->dst_offset * op->esize, op->dst_strides,
				 bounce + at, flat, op->ext, op->ndim, op->esize);
		at += (size_t)vps_op_bytes(op);
	}
}

static vps_result_t run_stages(const struct vps_staged *s, const struct vps_plan *p0, struct attach *at,
			       struct vps_net *net, struct vps_registry *reg, const struct vps_exec_opts *o,
			       struct vps_exec_report *rep)
{
	vps_result_t rc = VPS_OK;
	int64_t w = at->w;
	struct vps_net_msg *msgs = NULL;
	struct iovs *iov = NULL;
	unsigned char **bounce = NULL;
	const struct vps_xfer **mine = NULL;
	size_t capm = 0, capi = 0, capx = 0;
	rep->nstages = s->nstages;
	rep->stages = vps_calloc(s->nstages + 1, sizeof(*rep->stages));
	if (!rep->stages)
		return VPS_ENOMEM;
	size_t i = 0;
	double t_all = now();
	/* sources no stage reads are free from the start */
	for (size_t f = 0; f < s->nfrees && at->src_entry; f++)
		if (s->frees[f].rank == at->ra && s->frees[f].stage < 0 && s->frees[f].buffer < at->va.nbuffers)
			vps_registry_release(reg, (uint32_t)at->src_entry[s->frees[f].buffer]);
	for (size_t st = 0; st < s->nstages; st++) {
		double t0 = now();
		struct vps_exec_stage_report *sr = &rep->stages[st];
		if (o->fault_stage == (int64_t)st) {
			if (o->fault_exit)
				_exit(3);
			raise(SIGSTOP);
		}
		while (i < s->nxfers && s->xfers[i].stage < (int64_t)st)
			i++;
		size_t j = i, nx = 0, nm = 0;
		while (j < s->nxfers && s->xfers[j].stage == (int64_t)st)
			j++;
		/* retains now; this rank's transfers of the stage gathered */
		for (size_t k = i; k < j && !rc; k++) {
			const struct vps_xfer *x = &s->xfers[k];
			if (x->src == w && x->dst == w) {
				for (size_t q = 0; q < x->nops; q++) {
					const struct vps_op *op = &s->ops[x->first_op + q];
					vps_copy_strided((unsigned char *)at->dst[op->dst_buffer] + op->dst_offset * op->esize,
							 op->dst_strides,
							 (const unsigned char *)at->src[op->src_buffer] + op->src_offset * op->esize,
							 op->src_strides, op->ext, op->ndim, op->esize);
					sr->bytes_copied += vps_op_bytes(op);
				}
			} else if (x->src == w || x->dst == w) {
				rc = VPS_GROW(mine, capx, nx + 1);
				if (!rc)
					mine[nx++] = x;
			}
		}
		if (!rc && nx) {
			rc = VPS_GROW(msgs, capm, nx);
			if (!rc)
				rc = vps_grow((void **)&iov, &capi, nx, sizeof(*iov));
			if (!rc) {
				unsigned char **nb = vps_realloc_array(bounce, nx, sizeof(*bounce));
				rc = nb ? VPS_OK : VPS_ENOMEM;
				if (nb)
					bounce = nb;
			}
			if (!rc) {
				memset(iov, 0, nx * sizeof(*iov));
				memset(bounce, 0, nx * sizeof(*bounce));
			}
		}
		for (size_t k = 0; k < nx && !rc; k++) {
			const struct vps_xfer *x = mine[k];
			bool sending = x->src == w;
			size_t blen;
			rc = transfer_iovs(s, x, sending, sending ? at->src : at->dst, &iov[k], &bounce[k], &blen);
			/* connections are numbered by the first plan's world */
			int64_t peer = vps_world_of_device(p0->world, vps_world_device(s->plan->world, sending ? x->dst : x->src));
			size_t m = 0;
			while (m < nm && msgs[m].peer != peer)
				m++;
			if (m == nm) {
				memset(&msgs[nm], 0, sizeof(msgs[nm]));
				msgs[nm].peer = peer;
				msgs[nm].tag = xfer_tag(x);
				nm++;
			}
			int64_t bytes = 0;
			for (size_t q = 0; q < x->nops; q++)
				bytes += vps_op_bytes(&s->ops[x->first_op + q]);
			if (sending) {
				msgs[m].send = true;
				msgs[m].send_iov = iov[k].v;
				msgs[m].send_iovcnt = iov[k].n;
				sr->bytes_sent += bytes;
			} else {
				msgs[m].recv = true;
				msgs[m].recv_iov = iov[k].v;
				msgs[m].recv_iovcnt = iov[k].n;
				sr->bytes_received += bytes;
			}
		}
		if (!rc && nm) {
			char what[64];
			snprintf(what, sizeof(what), "stage %zu of %zu", st, s->nstages);
			rc = vps_net_exchange(net, msgs, nm, what);
		}
		for (size_t k = 0; k < nx; k++) {
			if (!rc && mine[k]->dst == w)
				unbounce(s, mine[k], at->dst, bounce[k]);
			free(bounce[k]);
			free(iov[k].v);
		}
		if (rc)
			goto done;
		/* sources read for the last time: the trainer may free them */
		for (size_t f = 0; f < s->nfrees && at->src_entry; f++)
			if (s->frees[f].rank == at->ra && s->frees[f].stage == (int64_t)st &&
			    s->frees[f].buffer < at->va.nbuffers)
				vps_registry_release(reg, (uint32_t)at->src_entry[s->frees[f].buffer]);
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
	free(msgs);
	free(iov);
	free(bounce);
	free(mine);
	return rc;
}

static vps_result_t one_switch(const struct vps_staged *s, const struct vps_plan *p0, int64_t w,
			       struct vps_registry *reg, struct vps_net *net, const struct vps_exec_opts *o,
			       uint64_t *last_seq, struct vps_exec_report *rep)
{
	vps_result_t rc;
	struct attach at = {0};
	const struct vps_plan *p = s->plan;
	uint64_t seq = 0;
	bool claimed = false;
	at.w = w;
	at.ra = vps_world_a_rank(p->world, w);
	at.rb = vps_world_b_rank(p->world, w);
	rep->rank = w;
	rep->world = vps_world_size(p->world);
	double t0 = now();
	VPS_CHECK_GOTO(vps_registry_claim(reg, *last_seq, o->wait ? -1 : o->timeout, &seq), rc, fail);
	claimed = true;
	*last_seq = seq;
	rep->switch_seq = seq;
	rep->waited_seconds = now() - t0;
	double t_pause = now();
	/* the trainer's registry must describe this plan's two layouts */
	uint64_t ha = vps_layout_hash(p->a), hb = vps_layout_hash(p->b);
	if (at.ra >= 0 && (vps_registry_layout_hash(reg) != ha || vps_registry_rank(reg) != at.ra)) {
		rc = vps_fail(VPS_EINPUT,
			      "registry %s: the trainer runs layout 0x%016" PRIx64 " rank %" PRId64
			      ", the plan's source is 0x%016" PRIx64 " rank %" PRId64,
			      vps_registry_name(reg), vps_registry_layout_hash(reg), vps_registry_rank(reg), ha, at.ra);
		goto fail;
	}
	if (vps_registry_target_hash(reg) != hb || vps_registry_target_rank(reg) != at.rb) {
		rc = vps_fail(VPS_EINPUT,
			      "registry %s: the trainer switches to layout 0x%016" PRIx64 " rank %" PRId64
			      ", the plan's target is 0x%016" PRIx64 " rank %" PRId64,
			      vps_registry_name(reg), vps_registry_target_hash(reg), vps_registry_target_rank(reg), hb, at.rb);
		goto fail;
	}
	if (at.ra >= 0) {
		VPS_CHECK_GOTO(vps_layout_rank(p->a, at.ra, &at.va), rc, fail);
		VPS_CHECK_GOTO(map_side(reg, &at.va, VPS_ROLE_SOURCE, &at.src, &at.src_entry), rc, fail);
	}
	if (at.rb >= 0) {
		VPS_CHECK_GOTO(vps_layout_rank(p->b, at.rb, &at.vb), rc, fail);
		VPS_CHECK_GOTO(map_side(reg, &at.vb, VPS_ROLE_TARGET, &at.dst, NULL), rc, fail);
	}
	/* the first rendezvous after the request: trainers reach their switch
	 * points at different times */
	struct vps_registry_training train;
	double normal = vps_net_set_timeout(net, vps_max64((int64_t)o->request_timeout, (int64_t)o->timeout));
	rc = share_training(net, s, w, reg, &train);
	vps_net_set_timeout(net, normal);
	if (rc)
		goto fail;
	uint64_t dig[2] = {0, 0};
	if (o->check && at.ra >= 0)
		VPS_CHECK_GOTO(vps_exec_digest(p->a, at.ra, at.src, &dig[0]), rc, fail);
	/* everyone attached: no byte moves before every rank is ready */
	VPS_CHECK_GOTO(vps_net_agree(net, true, "start"), rc, fail);
	rc = run_stages(s, p0, &at, net, reg, o, rep);
	if (!rc && o->check && at.rb >= 0)
		rc = vps_exec_digest(p->b, at.rb, at.dst, &dig[1]);
	{
		/* the verdict is global: done only when every rank moved its part
		 * (and the digests match); a rank keeps its own failure's words */
		char mine[1024];
		snprintf(mine, sizeof(mine), "%s", vps_last_error());
		vps_result_t agreed = vps_net_agree(net, rc == VPS_OK, "end of transfer");
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
	vps_registry_set_training(reg, &train);
	vps_registry_finish(reg, seq, 1, NULL);
	rep->pause_seconds = now() - t_pause;
	attach_release(&at);
	return VPS_OK;
fail:
	if (claimed)
		vps_registry_finish(reg, seq, 0, vps_last_error());
	attach_release(&at);
	return rc;
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
	int64_t *peers = NULL;
	size_t npeers = 0, capp = 0;
	char name[VPS_REGISTRY_NAME_MAX + 32];
	if (!nplans)
		return vps_fail(VPS_EINPUT, "no staged plan");
	const struct vps_plan *p0 = plans[0]->plan;
	int64_t W = vps_world_size(p0->world);
	if (o->rank < 0 || o->rank >= W)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the transition world of %" PRId64, o->rank, W);
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
			VPS_CHECK_GOTO(VPS_GROW(peers, capp, npeers + 1), rc, done);
			peers[npeers++] = q;
		}
		uint64_t hk = vps_staged_world_hash(s);
		hash = vps_hash64(&hk, sizeof(hk), hash);
	}
	VPS_CHECK_GOTO(registry_name(o->registry, p0, o->rank, o->local_rank, name, sizeof(name)), rc, done);
	double t_setup = now();
	VPS_CHECK_GOTO(open_registry(name, o->wait ? -1 : o->timeout, o->timeout, &reg), rc, done);
	struct vps_net_opts no = {o->rank, W, o->master_host, o->master_port, o->timeout, o->token, hash, peers, npeers};
	VPS_CHECK_GOTO(vps_net_start(&net, &no), rc, done);
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
		rc = one_switch(plans[k], p0, w, reg, net, o, &last_seq, &reports[k]);
		if (rc)
			goto done;
	}
done:
	if (rc && reg) {
		char msg[256];
		snprintf(msg, sizeof(msg), "rank %" PRId64 ": %s", o->rank, vps_last_error());
		vps_registry_abort(reg, msg);
	}
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
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_sent", r->bytes_sent), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_received", r->bytes_received), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes_copied", r->bytes_copied), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "setup_seconds", r->setup_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "waited_seconds", r->waited_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "pause_seconds", r->pause_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "transfer_seconds", r->transfer_seconds), rc, done);
		VPS_CHECK_GOTO(vps_w_double(w, "gb_per_second",
					    r->transfer_seconds > 0 ? moved / r->transfer_seconds / 1e9 : 0.0),
			       rc, done);
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
