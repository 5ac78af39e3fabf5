/* Staged plans in files (stage_io.h, vps-formats(5)): written measured,
 * then compressed as they go; read with every view checked against the
 * buffer it names. And the budgets files of vps-stage --budgets. */
#include <inttypes.h>
#include <stdio.h>

#include "io/doc.h"
#include "util/internal.h"
#include "model/layout_io.h"
#include "plan/plan_io.h"
#include "stage/stage_io.h"
#include "vps/stage.h"

static vps_result_t write_pair(struct vps_writer *w, const char *key, int64_t a, int64_t b)
{
	int64_t v[2] = {a, b};
	return vps_ints_write(w, key, v, 2);
}

static vps_result_t read_ints(struct vps_reader *r, const char *key, int64_t *v, int n, int64_t min, int64_t max)
{
	uint64_t k;
	VPS_CHECK(vps_r_seq_begin(r, key, &k));
	if (k != (uint64_t)n)
		return vps_r_error(r, key, "expected %d numbers", n);
	for (int i = 0; i < n; i++)
		VPS_CHECK(vps_r_int(r, NULL, &v[i], min, max));
	return vps_r_seq_end(r);
}

static vps_result_t write_op(struct vps_writer *w, const struct vps_op *o)
{
	VPS_CHECK(vps_w_map_begin(w, NULL));
	VPS_CHECK(vps_w_int(w, "piece", o->piece));
	VPS_CHECK(vps_w_int(w, "pieces", o->npieces));
	VPS_CHECK(vps_w_int(w, "esize", o->esize));
	VPS_CHECK(vps_ints_write(w, "ext", o->ext, o->ndim));
	VPS_CHECK(vps_w_int(w, "src_buffer", o->src_buffer));
	VPS_CHECK(vps_w_int(w, "src_offset", o->src_offset));
	VPS_CHECK(vps_ints_write(w, "src_strides", o->src_strides, o->ndim));
	VPS_CHECK(vps_w_int(w, "dst_buffer", o->dst_buffer));
	VPS_CHECK(vps_w_int(w, "dst_offset", o->dst_offset));
	VPS_CHECK(vps_ints_write(w, "dst_strides", o->dst_strides, o->ndim));
	VPS_CHECK(vps_w_int(w, "staging", o->staging));
	return vps_w_map_end(w);
}

/* more: a counting pass (the plan's pieces and the copies measured, not
 * all written) */
static vps_result_t write_staged(struct vps_writer *w, const struct vps_staged *s, uint64_t hash, uint64_t *more)
{
	uint64_t op_bytes[VPS_MAX_DIMS + 1] = {0}; /* by axes, once measured */
	vps_result_t rc;
	VPS_CHECK_GOTO(vps_w_u64hex(w, "hash", hash), rc, done);
	VPS_CHECK_GOTO(vps_w_int(w, "budget", s->budget), rc, done);
	VPS_CHECK_GOTO(vps_w_int(w, "scope", s->scope), rc, done);
	VPS_CHECK_GOTO(vps_w_int(w, "steps", s->steps), rc, done);
	VPS_CHECK_GOTO(vps_w_map_begin(w, "plan"), rc, done);
	VPS_CHECK_GOTO(more ? vps_plan_count_body(w, s->plan, more) : vps_plan_write_body(w, s->plan), rc, done);
	VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
	VPS_CHECK_GOTO(vps_w_seq_begin(w, "stages", s->nstages, false), rc, done);
	for (size_t i = 0; i < s->nstages; i++) {
		const struct vps_stage_info *g = &s->stages[i];
		VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
		VPS_CHECK_GOTO(write_pair(w, "first", g->first_unit_step, g->first_unit_chunk), rc, done);
		VPS_CHECK_GOTO(write_pair(w, "last", g->last_unit_step, g->last_unit_chunk), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes", g->bytes), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "peak", g->peak), rc, done);
		VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
	}
	VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
	VPS_CHECK_GOTO(vps_w_seq_begin(w, "transfers", s->nxfers, false), rc, done);
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "stage", x->stage), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "step", x->step), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "chunk", x->chunk), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "src", x->src), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "dst", x->dst), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "bytes", x->bytes), rc, done);
		VPS_CHECK_GOTO(vps_w_seq_begin(w, "ops", x->nops, false), rc, done);
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			/* counting: an op's bytes depend on its axes alone */
			if (more && op_bytes[o->ndim]) {
				*more += op_bytes[o->ndim];
				continue;
			}
			uint64_t before = vps_writer_count(w);
			VPS_CHECK_GOTO(write_op(w, o), rc, done);
			if (more)
				op_bytes[o->ndim] = vps_writer_count(w) - before;
		}
		VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
		VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
	}
	VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
	VPS_CHECK_GOTO(vps_w_seq_begin(w, "frees", s->nfrees, false), rc, done);
	for (size_t i = 0; i < s->nfrees; i++) {
		VPS_CHECK_GOTO(vps_w_map_begin(w, NULL), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "rank", s->frees[i].rank), rc, done);
		VPS_CHECK_GOTO(vps_w_int(w, "buffer", s->frees[i].buffer), rc, done);
		VPS_CHECK_GOTO(write_pair(w, "last_read", s->frees[i].step, s->frees[i].chunk), rc, done);
		VPS_CHECK_GOTO(vps_w_map_end(w), rc, done);
	}
	VPS_CHECK_GOTO(vps_w_seq_end(w), rc, done);
	rc = VPS_OK;
done:
	return rc;
}

/* Binary: measured by a writer that keeps nothing, then compressed as it is
 * written, so the payload is never held whole (a staged plan of 16,384 ranks
 * is gigabytes uncompressed). */
vps_result_t vps_staged_serialize(const struct vps_staged *s, bool yaml, struct vps_bytes *out)
{
	struct vps_writer *w = NULL;
	uint64_t hash = vps_staged_hash(s);
	vps_result_t rc;
	if (yaml) {
		VPS_CHECK(vps_writer_new(&w, VPS_DOC_STAGED, true));
		rc = write_staged(w, s, hash, NULL);
	} else {
		uint64_t more = 0;
		VPS_CHECK(vps_writer_new_counting(&w, VPS_DOC_STAGED));
		rc = write_staged(w, s, hash, &more);
		uint64_t n = vps_writer_count(w) + more;
		vps_writer_free(w);
		w = NULL;
		if (!rc)
			rc = vps_writer_new_streaming(&w, VPS_DOC_STAGED, n);
		if (!rc)
			rc = write_staged(w, s, hash, NULL);
	}
	if (!rc)
		rc = vps_writer_finish(w, out);
	vps_writer_free(w);
	return rc;
}

static vps_result_t read_stages(struct vps_reader *r, struct vps_staged *s)
{
	uint64_t n;
	VPS_CHECK(vps_r_seq_begin(r, "stages", &n));
	if (!s->cut && n)
		return vps_r_error(r, "stages", "a one-rank plan's stages are cut by its executors, not listed");
	s->stages = vps_calloc((size_t)n + 1, sizeof(*s->stages));
	if (!s->stages)
		return VPS_ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		struct vps_stage_info *g = &s->stages[i];
		int64_t v[2];
		VPS_CHECK(vps_r_map_begin(r, NULL));
		VPS_CHECK(read_ints(r, "first", v, 2, 0, INT64_MAX));
		g->first_unit_step = v[0];
		g->first_unit_chunk = v[1];
		VPS_CHECK(read_ints(r, "last", v, 2, 0, INT64_MAX));
		g->last_unit_step = v[0];
		g->last_unit_chunk = v[1];
		VPS_CHECK(vps_r_int(r, "bytes", &g->bytes, 0, INT64_MAX));
		VPS_CHECK(vps_r_int(r, "peak", &g->peak, 0, INT64_MAX));
		VPS_CHECK(vps_r_map_end(r));
		s->nstages++;
	}
	return vps_r_seq_end(r);
}

/* Every view of copy o of transfer x inside the buffer it names, before
 * anything (vps-verify, vps-exec) walks it; what names the copy in
 * messages. */
static vps_result_t op_views_check(struct vps_reader *r, const struct vps_staged *s, const struct vps_xfer *x,
				   const struct vps_op *o, const char *what)
{
	for (int side = 0; side < 2; side++) {
		int64_t rank = side ? x->dst : x->src;
		uint32_t buffer = side ? o->dst_buffer : o->src_buffer;
		/* a forward's source is the relay's B buffer */
		bool target = side || (buffer & VPS_BUFFER_TARGET);
		int64_t nel = vps_buffer_hop(buffer) < 0 ? -2
			      : vps_plan_side_elements(s->plan, !target, rank, vps_buffer_index(buffer));
		char sw[128];
		snprintf(sw, sizeof(sw), "%s: %s", what, side ? "destination" : "source");
		if (nel == -2)
			return vps_r_error(r, side ? "dst_buffer" : "src_buffer", "%s: rank %" PRId64 " has no buffer %u", sw,
					   rank, buffer);
		VPS_CHECK(vps_view_check(r, side ? "dst_strides" : "src_strides", sw, o->ndim, o->ext,
					 side ? o->dst_offset : o->src_offset, side ? o->dst_strides : o->src_strides,
					 buffer, nel));
	}
	return VPS_OK;
}

/* Copy k of transfer i (x), into s->ops[s->nops]. */
static vps_result_t read_op(struct vps_reader *r, struct vps_staged *s, const struct vps_xfer *x, uint64_t i,
			    uint64_t k, size_t *capo)
{
	VPS_CHECK(VPS_GROW(s->ops, *capo, s->nops + 1));
	struct vps_op *o = &s->ops[s->nops];
	memset(o, 0, sizeof(*o));
	int64_t v;
	uint64_t ne;
	VPS_CHECK(vps_r_map_begin(r, NULL));
	VPS_CHECK(vps_r_int(r, "piece", &o->piece, 0, (int64_t)s->plan->npieces - 1));
	VPS_CHECK(vps_r_int(r, "pieces", &v, 1, INT32_MAX));
	o->npieces = (int32_t)v;
	VPS_CHECK(vps_r_int(r, "esize", &v, 1, 8));
	o->esize = (uint8_t)v;
	VPS_CHECK(vps_r_seq_begin(r, "ext", &ne));
	if (ne < 1 || ne > VPS_MAX_DIMS)
		return vps_r_error(r, "ext", "1 to %d axes", VPS_MAX_DIMS);
	o->ndim = (int)ne;
	for (int d = 0; d < o->ndim; d++)
		VPS_CHECK(vps_r_int(r, NULL, &o->ext[d], 1, VPS_MAX_ELEMENTS));
	VPS_CHECK(vps_r_seq_end(r));
	char what[96];
	snprintf(what, sizeof(what), "transfer %" PRIu64 " op %" PRIu64 " (piece %" PRId64 ")", i, k, o->piece);
	if (o->npieces > (int64_t)s->plan->npieces)
		return vps_r_error(r, "pieces", "%s: %d pieces, more than the plan's %zu", what, o->npieces,
				   s->plan->npieces);
	if (vps_ext_volume(o->ndim, o->ext) < 0 || vps_ext_volume(o->ndim, o->ext) > VPS_MAX_ELEMENTS)
		return vps_r_error(r, "ext", "%s: more than 2^48 elements", what);
	VPS_CHECK(vps_r_int(r, "src_buffer", &v, 0, UINT32_MAX));
	o->src_buffer = (uint32_t)v;
	VPS_CHECK(vps_r_int(r, "src_offset", &o->src_offset, 0, VPS_MAX_ELEMENTS));
	VPS_CHECK(read_ints(r, "src_strides", o->src_strides, o->ndim, -VPS_MAX_ELEMENTS, VPS_MAX_ELEMENTS));
	VPS_CHECK(vps_r_int(r, "dst_buffer", &v, 0, UINT32_MAX));
	o->dst_buffer = (uint32_t)v;
	VPS_CHECK(vps_r_int(r, "dst_offset", &o->dst_offset, 0, VPS_MAX_ELEMENTS));
	VPS_CHECK(read_ints(r, "dst_strides", o->dst_strides, o->ndim, -VPS_MAX_ELEMENTS, VPS_MAX_ELEMENTS));
	VPS_CHECK(vps_r_int(r, "staging", &o->staging, -1, VPS_MAX_ELEMENTS * 8));
	VPS_CHECK(op_views_check(r, s, x, o, what));
	VPS_CHECK(vps_r_map_end(r));
	s->nops++;
	return VPS_OK;
}

static vps_result_t read_xfers(struct vps_reader *r, struct vps_staged *s, int64_t W)
{
	uint64_t n;
	size_t capo = 0;
	VPS_CHECK(vps_r_seq_begin(r, "transfers", &n));
	s->xfers = vps_calloc((size_t)n + 1, sizeof(*s->xfers));
	if (!s->xfers)
		return VPS_ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		struct vps_xfer *x = &s->xfers[i];
		uint64_t no;
		VPS_CHECK(vps_r_map_begin(r, NULL));
		VPS_CHECK(vps_r_int(r, "stage", &x->stage, s->cut ? 0 : -1, s->cut ? (int64_t)s->nstages - 1 : -1));
		VPS_CHECK(vps_r_int(r, "step", &x->step, 0, INT64_MAX));
		VPS_CHECK(vps_r_int(r, "chunk", &x->chunk, 0, INT64_MAX));
		VPS_CHECK(vps_r_int(r, "src", &x->src, 0, W - 1));
		VPS_CHECK(vps_r_int(r, "dst", &x->dst, 0, W - 1));
		VPS_CHECK(vps_r_int(r, "bytes", &x->bytes, 0, VPS_MAX_ELEMENTS * 8));
		VPS_CHECK(vps_r_seq_begin(r, "ops", &no));
		x->first_op = s->nops;
		for (uint64_t k = 0; k < no; k++)
			VPS_CHECK(read_op(r, s, x, i, k, &capo));
		x->nops = (size_t)no;
		VPS_CHECK(vps_r_seq_end(r));
		VPS_CHECK(vps_r_map_end(r));
		s->nxfers++;
	}
	return vps_r_seq_end(r);
}

static vps_result_t read_frees(struct vps_reader *r, struct vps_staged *s, int64_t W)
{
	uint64_t n;
	VPS_CHECK(vps_r_seq_begin(r, "frees", &n));
	s->frees = vps_calloc((size_t)n + 1, sizeof(*s->frees));
	if (!s->frees)
		return VPS_ENOMEM;
	for (uint64_t i = 0; i < n; i++) {
		struct vps_free *f = &s->frees[i];
		int64_t v, u[2];
		VPS_CHECK(vps_r_map_begin(r, NULL));
		VPS_CHECK(vps_r_int(r, "rank", &f->rank, 0, W - 1));
		VPS_CHECK(vps_r_int(r, "buffer", &v, 0, UINT32_MAX));
		f->buffer = (uint32_t)v;
		if (vps_plan_side_elements(s->plan, true, f->rank, f->buffer) < 0)
			return vps_r_error(r, "buffer", "free %" PRIu64 ": rank %" PRId64 " has no buffer %u under the source layout",
					   i, f->rank, f->buffer);
		VPS_CHECK(read_ints(r, "last_read", u, 2, -1, INT64_MAX));
		if (u[0] > s->steps || u[1] < 0 || (u[0] < 0 && u[1]))
			return vps_r_error(r, "last_read", "free %" PRIu64 ": (%" PRId64 ", %" PRId64 ") is no unit of steps 0..%" PRId64
					   " (never read: [-1, 0])", i, u[0], u[1], s->steps);
		f->step = u[0];
		f->chunk = u[1];
		f->stage = u[0] < 0 ? -1 : vps_staged_stage_of(s, u[0], u[1]);
		if (s->cut && u[0] >= 0 && f->stage < 0)
			return vps_r_error(r, "last_read", "free %" PRIu64 ": unit (%" PRId64 ", %" PRId64 ") lies in no stage",
					   i, u[0], u[1]);
		VPS_CHECK(vps_r_map_end(r));
		s->nfrees++;
	}
	return vps_r_seq_end(r);
}

vps_result_t vps_staged_read_body(struct vps_reader *r, struct vps_staged *s)
{
	uint64_t plan_hash;
	int64_t W;
	VPS_CHECK(vps_r_u64hex(r, "hash", &s->file_hash));
	if (!s->file_hash)
		return vps_r_error(r, "hash", "0 is not the hash of any staged plan");
	VPS_CHECK(vps_r_int(r, "budget", &s->budget, VPS_STAGE_BUDGET_FLOOR, INT64_MAX));
	VPS_CHECK(vps_r_int(r, "scope", &s->scope, -1, INT64_MAX));
	VPS_CHECK(vps_r_int(r, "steps", &s->steps, 0, INT64_MAX));
	VPS_CHECK(vps_r_map_begin(r, "plan"));
	VPS_CHECK(vps_plan_read_body(r, &s->plan, &plan_hash));
	s->plan->file_hash = plan_hash;
	VPS_CHECK(vps_r_map_end(r));
	W = vps_world_size(s->plan->world);
	if (s->steps != vps_stage_steps(W))
		return vps_r_error(r, "steps", "%" PRId64 " steps, a world of %" PRId64 " has %" PRId64, s->steps, W,
				   vps_stage_steps(W));
	/* a one-rank plan's stages are cut by its executors */
	s->cut = s->plan->scope < 0;
	if (s->scope >= W)
		return vps_r_error(r, "scope", "rank %" PRId64 " is outside the world of %" PRId64, s->scope, W);
	if (s->plan->scope >= 0 && s->scope != s->plan->scope)
		return vps_r_error(r, "scope", "%" PRId64 ", its plan is rank %" PRId64 "'s", s->scope, s->plan->scope);
	VPS_CHECK(read_stages(r, s));
	VPS_CHECK(read_xfers(r, s, W));
	return read_frees(r, s, W);
}

vps_result_t vps_staged_parse(struct vps_staged **out, const char *name, const void *data, size_t len)
{
	struct vps_reader *r;
	*out = NULL;
	VPS_CHECK(vps_reader_new(&r, name, data, len, VPS_DOC_STAGED));
	struct vps_staged *s = vps_calloc(1, sizeof(*s));
	vps_result_t rc = s ? vps_staged_read_body(r, s) : VPS_ENOMEM;
	if (!rc)
		rc = vps_reader_finish(r);
	vps_reader_free(r);
	if (rc) {
		vps_staged_free(s);
		return rc;
	}
	*out = s;
	return VPS_OK;
}

vps_result_t vps_staged_load(struct vps_staged **out, const char *path)
{
	struct vps_bytes b;
	*out = NULL;
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_staged_parse(out, path && strcmp(path, "-") ? path : "<stdin>", b.data, b.len);
	vps_bytes_release(&b);
	return rc;
}

vps_result_t vps_budgets_load(const char *path, int64_t *min_budget)
{
	struct vps_bytes b;
	struct vps_reader *r = NULL;
	uint64_t n;
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_reader_new(&r, path, b.data, b.len, VPS_DOC_BUDGETS);
	if (!rc)
		rc = vps_r_seq_begin(r, "budgets", &n);
	if (!rc && n == 0)
		rc = vps_r_error(r, "budgets", "lists no budget");
	*min_budget = INT64_MAX;
	for (uint64_t i = 0; !rc && i < n; i++) {
		const char *s;
		int64_t v;
		rc = vps_r_str(r, NULL, &s);
		if (!rc && vps_parse_bytes(s, &v))
			rc = vps_r_error(r, "budgets", "item %" PRIu64 ": '%s' is not a size", i, s);
		if (!rc && v < *min_budget)
			*min_budget = v;
	}
	if (!rc)
		rc = vps_r_seq_end(r);
	if (!rc)
		rc = vps_reader_finish(r);
	vps_reader_free(r);
	vps_bytes_release(&b);
	return rc;
}
