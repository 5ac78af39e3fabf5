/* Queries over layouts and plans (vps/query.h), answered as records
 * (lib/io/records.c). */
#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>

#include "util/internal.h"
#include "plan/piece.h"
#include "stage/op.h"
#include "vps/query.h"

const struct vps_field vps_holder_fields[] = {
	{"tensor", VPS_FIELD_STR}, {"state", VPS_FIELD_STR},  {"ranks", VPS_FIELD_STR},   {"base", VPS_FIELD_INT},
	{"stride", VPS_FIELD_INT}, {"count", VPS_FIELD_INT},  {"buffer", VPS_FIELD_INT},  {"box", VPS_FIELD_BOX},
	{"offset", VPS_FIELD_INT}, {"strides", VPS_FIELD_INTS}, {"bytes", VPS_FIELD_INT},
};
const size_t vps_holder_nfields = sizeof(vps_holder_fields) / sizeof(*vps_holder_fields);

const struct vps_field vps_transfer_fields[] = {
	{"rank", VPS_FIELD_INT},       {"direction", VPS_FIELD_STR},  {"peer", VPS_FIELD_INT},
	{"tensor", VPS_FIELD_STR},     {"state", VPS_FIELD_STR},      {"box", VPS_FIELD_BOX},
	{"bytes", VPS_FIELD_INT},      {"src_buffer", VPS_FIELD_INT}, {"src_offset", VPS_FIELD_INT},
	{"dst_buffer", VPS_FIELD_INT}, {"dst_offset", VPS_FIELD_INT}, {"stage", VPS_FIELD_INT},
	{"chunk", VPS_FIELD_INT},      {"forward", VPS_FIELD_INT},    {"piece", VPS_FIELD_INT},
};
const size_t vps_transfer_nfields = sizeof(vps_transfer_fields) / sizeof(*vps_transfer_fields);
/* The columns of vps_transfer_fields put_transfer names a transit area in. */
enum {
	TRANSFER_NFIELDS = sizeof(vps_transfer_fields) / sizeof(*vps_transfer_fields),
	TRANSFER_SRC_BUFFER = 7,
	TRANSFER_DST_BUFFER = 9,
};

/* ---- arguments ---- */

/* A decimal in [0, 2^48]; *end past it. */
static bool parse_coord(const char *s, const char **end, int64_t *v)
{
	int64_t x = 0;
	const char *p = s;
	if (*p < '0' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		x = x * 10 + (*p - '0');
		if (x > VPS_MAX_ELEMENTS)
			return false;
	}
	*end = p;
	*v = x;
	return true;
}

vps_result_t vps_box_parse(const char *s, struct vps_box *b)
{
	memset(b, 0, sizeof(*b));
	const char *p = s;
	for (;;) {
		if (b->ndim == VPS_MAX_DIMS)
			return vps_fail(VPS_EINPUT, "'%s' has more than %d axes", s, VPS_MAX_DIMS);
		int k = b->ndim;
		if (!parse_coord(p, &p, &b->lo[k]) || *p++ != ':' || !parse_coord(p, &p, &b->hi[k]) ||
		    (*p && *p != ','))
			return vps_fail(VPS_EINPUT, "'%s' is not LO:HI,LO:HI,... (axis %d; numbers up to 2^48)", s,
					k);
		if (b->lo[k] >= b->hi[k])
			return vps_fail(VPS_EINPUT, "axis %d: %" PRId64 ":%" PRId64 " is empty (LO < HI)", k,
					b->lo[k], b->hi[k]);
		b->ndim++;
		if (!*p)
			return VPS_OK;
		p++;
	}
}

void vps_ranks_format(int64_t base, int64_t stride, int64_t count, char *buf, size_t n)
{
	if (count <= 1)
		snprintf(buf, n, "%" PRId64, base);
	else if (stride == 1)
		snprintf(buf, n, "%" PRId64 "-%" PRId64, base, base + count - 1);
	else
		snprintf(buf, n, "%" PRId64 "-%" PRId64 ":%" PRId64, base, base + (count - 1) * stride, stride);
}

void vps_query_init(struct vps_query *q)
{
	memset(q, 0, sizeof(*q));
	q->state = -1;
	q->rank = q->peer = q->stage = -1;
}

/* ---- which tensors ---- */

/* The tensors a query names: all, one, or those a glob matches (a bitmap
 * over the ids, made by one pass over the names). */
struct tensor_set {
	uint32_t one;    /* UINT32_MAX: not a single tensor */
	uint8_t *bits;   /* a glob: matched ids */
	bool all;
	size_t count;
};

static bool is_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

static bool tensor_in(const struct tensor_set *ts, uint32_t id)
{
	if (ts->all)
		return true;
	if (ts->bits)
		return ts->bits[id / 8] >> (id % 8) & 1;
	return id == ts->one;
}

/* want_ndim > 0: a glob keeps only tensors of that many axes (a --box). */
static vps_result_t tensor_set_init(struct tensor_set *ts, const struct vps_model *m, const char *pattern,
				    int want_ndim)
{
	memset(ts, 0, sizeof(*ts));
	ts->one = UINT32_MAX;
	if (!pattern) {
		ts->all = true;
		ts->count = vps_model_num_tensors(m);
		return VPS_OK;
	}
	if (!is_glob(pattern)) {
		if (vps_model_find_tensor(m, pattern, &ts->one))
			return vps_fail(VPS_ENOTFOUND, "%s has no tensor named '%s' (a glob such as "
					"'decoder.layers.0.*' lists names)", m->name, pattern);
		ts->count = 1;
		return VPS_OK;
	}
	uint32_t n = vps_model_num_tensors(m);
	ts->bits = vps_calloc((size_t)n / 8 + 1, 1);
	if (!ts->bits)
		return VPS_ENOMEM;
	size_t any = 0;
	for (uint32_t id = 0; id < n; id++) {
		struct vps_tensor t;
		char name[512];
		VPS_CHECK(vps_model_tensor(m, id, &t));
		vps_tensor_name(&t, name, sizeof(name));
		if (fnmatch(pattern, name, 0))
			continue;
		any++;
		if (want_ndim > 0 && t.ndim != want_ndim)
			continue;
		ts->bits[id / 8] |= (uint8_t)(1u << (id % 8));
		ts->count++;
	}
	if (!any) {
		free(ts->bits);
		ts->bits = NULL;
		return vps_fail(VPS_ENOTFOUND, "'%s' matches no tensor of %s", pattern, m->name);
	}
	if (!ts->count) {
		free(ts->bits);
		ts->bits = NULL;
		return vps_fail(VPS_EINPUT, "a box of %d axes, and none of the %zu tensors '%s' matches has that many",
				want_ndim, any, pattern);
	}
	return VPS_OK;
}

static void tensor_set_release(struct tensor_set *ts)
{
	free(ts->bits);
	ts->bits = NULL;
}

/* A tensor's name, remembered for the next record of the same tensor. */
struct name_cache {
	uint32_t id;
	bool valid;
	char name[512];
};

static vps_result_t tensor_name(const struct vps_model *m, uint32_t id, struct name_cache *c)
{
	if (c->valid && c->id == id)
		return VPS_OK;
	struct vps_tensor t;
	VPS_CHECK(vps_model_tensor(m, id, &t));
	vps_tensor_name(&t, c->name, sizeof(c->name));
	c->id = id;
	c->valid = true;
	return VPS_OK;
}

/* ---- holders ---- */

static vps_result_t no_state(const char *what, const struct vps_layout *l, int state)
{
	const struct vps_parallel *p = vps_layout_parallel(l);
	char why[96];
	if (state == VPS_STATE_MODULE)
		snprintf(why, sizeof(why), "the model has no module buffers");
	else if (p->family == VPS_FAMILY_DTENSOR)
		snprintf(why, sizeof(why), "family=dtensor holds main_param, exp_avg and exp_avg_sq");
	else if (state == VPS_STATE_GRAD)
		snprintf(why, sizeof(why), "grad=1 adds it");
	else if (p->optimizer == VPS_OPT_MUON || p->optimizer == VPS_OPT_LION)
		snprintf(why, sizeof(why), "neither %s nor %s keeps one", vps_optimizer_name(p->optimizer),
			 vps_optimizer_name(p->scalar_optimizer));
	else
		snprintf(why, sizeof(why), "%s keeps none", vps_optimizer_name(p->optimizer));
	return vps_fail(VPS_EINPUT, "%s no %s (%s)", what, vps_state_name(state), why);
}

vps_result_t vps_query_holders(const struct vps_layout *l, const struct vps_query *q, enum vps_format f,
			       struct vps_bytes *out)
{
	const struct vps_model *m = vps_layout_model(l);
	struct tensor_set ts;
	struct vps_holders h = {0};
	struct vps_records rec;
	vps_result_t rc;
	if (q->state >= 0 && !vps_layout_has_state(l, q->state))
		return no_state("this layout holds", l, q->state);
	VPS_CHECK(tensor_set_init(&ts, m, q->tensor, q->has_box ? q->box.ndim : 0));
	VPS_CHECK_GOTO(vps_records_begin(&rec, out, f, vps_holder_fields, vps_holder_nfields), rc, done);
	uint32_t n = vps_model_num_tensors(m);
	for (uint32_t id = ts.one != UINT32_MAX ? ts.one : 0; id < n; id++) {
		if (!tensor_in(&ts, id))
			continue;
		struct vps_tensor t;
		char name[512];
		VPS_CHECK_GOTO(vps_model_tensor(m, id, &t), rc, done);
		vps_tensor_name(&t, name, sizeof(name));
		if (q->has_box && ts.one != UINT32_MAX) {
			if (t.ndim != q->box.ndim) {
				rc = vps_fail(VPS_EINPUT, "a box of %d axes, but %s has %d", q->box.ndim, name, t.ndim);
				goto done;
			}
			for (int k = 0; k < t.ndim; k++)
				if (q->box.hi[k] > t.shape[k]) {
					rc = vps_fail(VPS_EINPUT, "box axis %d: %" PRId64 ":%" PRId64
						      " is outside %s, 0:%" PRId64, k, q->box.lo[k], q->box.hi[k], name,
						      t.shape[k]);
					goto done;
				}
		}
		for (int st = q->state < 0 ? 0 : q->state; st < (q->state < 0 ? VPS_NSTATES : q->state + 1); st++) {
			if (!vps_layout_tensor_has_state(l, &t, st))
				continue;
			h.n = 0;
			VPS_CHECK_GOTO(vps_layout_holders(l, id, st, q->has_box ? &q->box : NULL, &h), rc, done);
			for (size_t i = 0; i < h.n; i++) {
				const struct vps_holder *x = &h.v[i];
				struct vps_region part = x->region;
				if (q->has_box) {
					struct vps_box b;
					if (!vps_box_intersect(&x->region.box, &q->box, &b))
						continue;
					vps_region_restrict(&x->region, &b, &part);
				}
				char ranks[96];
				vps_ranks_format(x->base, x->stride, x->count, ranks, sizeof(ranks));
				struct vps_value v[] = {
					{.s = name},
					{.s = vps_state_name(st)},
					{.s = ranks},
					{.i = x->base},
					{.i = x->stride},
					{.i = x->count},
					{.i = part.buffer},
					{.box = &part.box},
					{.i = part.offset},
					{.ints = part.strides, .nints = part.box.ndim},
					{.i = vps_box_volume(&part.box) * (int64_t)vps_dtype_size(vps_region_dtype(&part))},
				};
				VPS_CHECK_GOTO(vps_records_put(&rec, v), rc, done);
			}
		}
		if (ts.one != UINT32_MAX)
			break;
	}
	rc = vps_records_end(&rec);
done:
	vps_holders_release(&h);
	tensor_set_release(&ts);
	return rc;
}

/* ---- transfers ---- */

/* The world rank asked about, checked against the plan's scope. */
static vps_result_t query_rank(const struct vps_query *q, int64_t scope, int64_t world, const char *what,
			       int64_t *rank)
{
	*rank = q->rank;
	if (scope >= 0) {
		if (q->rank >= 0 && q->rank != scope)
			return vps_fail(VPS_EINPUT, "rank %" PRId64 ", but the %s holds world rank %" PRId64
				       "'s part only", q->rank, what, scope);
		*rank = scope;
	}
	if (*rank < 0)
		return vps_fail(VPS_EINPUT, "a global %s needs a rank (whose transfers)", what);
	if (*rank >= world)
		return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the world of %" PRId64 " ranks", *rank,
				world);
	if (q->peer >= world)
		return vps_fail(VPS_EINPUT, "peer %" PRId64 " is outside the world of %" PRId64 " ranks", q->peer,
				world);
	return VPS_OK;
}

/* What one record of a transfer says. */
struct xrec {
	int64_t rank, src, dst;
	uint32_t tensor;
	int state, dtype;
	struct vps_box box;
	int64_t src_buffer, src_offset, dst_buffer, dst_offset;
	int64_t stage, chunk;
	int64_t piece; /* its index in the plan, as vps-verify and vps-stage name it */
};

static vps_result_t put_transfer(struct vps_records *rec, const struct vps_model *m, struct name_cache *nc,
				 const struct xrec *x)
{
	VPS_CHECK(tensor_name(m, x->tensor, nc));
	const char *dir = x->src == x->dst ? "retain" : x->src == x->rank ? "send" : "recv";
	int64_t peer = x->src == x->rank ? x->dst : x->src;
	struct vps_value v[] = {
		{.i = x->rank},
		{.s = dir},
		{.i = peer},
		{.s = nc->name},
		{.s = vps_state_name(x->state)},
		{.box = &x->box},
		{.i = vps_box_volume(&x->box) * (int64_t)vps_dtype_size(vps_dtype_of((uint8_t)x->dtype, x->state))},
		/* a relay's forward reads its B buffer: said apart, not as a
		 * buffer number with the flag bit set */
		{.i = vps_buffer_index(x->src_buffer)},
		{.i = x->src_offset},
		{.i = x->dst_buffer},
		{.i = x->dst_offset},
		{.i = x->stage},
		{.i = x->chunk},
		{.i = vps_buffer_hop(x->src_buffer)},
		{.i = x->piece},
	};
	/* a transit area is a buffer of neither layout: YAML and JSON name it
	 * `transit`, TSV (a column of numbers, for awk) keeps its number,
	 * VPS_BUFFER_TRANSIT; the records of a plan without transit are as
	 * before */
	bool from_area = (x->src_buffer & VPS_BUFFER_TARGET) && vps_buffer_index((uint32_t)x->src_buffer) == VPS_BUFFER_TRANSIT;
	bool to_area = x->dst_buffer == VPS_BUFFER_TRANSIT;
	if (rec->format == VPS_FORMAT_TSV || (!from_area && !to_area))
		return vps_records_put(rec, v);
	struct vps_field fields[TRANSFER_NFIELDS];
	memcpy(fields, vps_transfer_fields, sizeof(fields));
	if (from_area) {
		fields[TRANSFER_SRC_BUFFER].type = VPS_FIELD_STR;
		v[TRANSFER_SRC_BUFFER].s = "transit";
	}
	if (to_area) {
		fields[TRANSFER_DST_BUFFER].type = VPS_FIELD_STR;
		v[TRANSFER_DST_BUFFER].s = "transit";
	}
	const struct vps_field *keep = rec->fields;
	rec->fields = fields;
	vps_result_t rc = vps_records_put(rec, v);
	rec->fields = keep;
	return rc;
}

static bool pair_wanted(const struct vps_query *q, int64_t rank, int64_t src, int64_t dst)
{
	if (src != rank && dst != rank)
		return false;
	return q->peer < 0 || q->peer == (src == rank ? dst : src);
}

vps_result_t vps_query_transfers(const struct vps_plan *p, const struct vps_query *q, enum vps_format f,
				 struct vps_bytes *out)
{
	const struct vps_model *m = vps_layout_model(p->a);
	int64_t rank;
	struct tensor_set ts;
	struct vps_records rec;
	struct name_cache nc = {0};
	vps_result_t rc;
	if (q->stage >= 0)
		return vps_fail(VPS_EINPUT, "stage %" PRId64 ": a plan has no stages (vps-stage(1) stages it)", q->stage);
	if (q->state >= 0 && !vps_layout_has_state(p->a, q->state))
		return no_state("this plan moves", p->a, q->state);
	VPS_CHECK(query_rank(q, p->scope, vps_world_size(p->world), "plan", &rank));
	VPS_CHECK(tensor_set_init(&ts, m, q->tensor, 0));
	VPS_CHECK_GOTO(vps_records_begin(&rec, out, f, vps_transfer_fields, vps_transfer_nfields), rc, done);
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, p);
	for (const struct vps_piece *x; (x = vps_piece_iter_next(&it));) {
		if (!pair_wanted(q, rank, x->src, x->dst) || !tensor_in(&ts, x->tensor) ||
		    (q->state >= 0 && x->state != q->state))
			continue;
		struct xrec r = {rank, x->src, x->dst, x->tensor, x->state, x->dtype, x->box, x->src_buffer, x->src_offset,
				 x->dst_buffer, x->dst_offset, -1, -1, (int64_t)it.i - 1};
		VPS_CHECK_GOTO(put_transfer(&rec, m, &nc, &r), rc, done);
	}
	rc = vps_records_end(&rec);
done:
	tensor_set_release(&ts);
	return rc;
}

/* ---- staged transfers: which parts of which pieces each copy carries ----
 *
 * A copy (op) of a staged plan names the first plan piece it carries, and
 * vps_piece_match (plan/piece.h, as vps-verify) says what it carries of it.
 * A strided piece is never merged: its copies are sub-boxes of it, with its
 * addressing. Flat pieces (contiguous on both sides) of one pair are merged
 * in destination address order, which need not be the plan's order, so a
 * flat copy is matched by address: the pieces of its pair whose destination
 * ranges it overlaps, found in an index sorted by address. */

struct flat {
	int64_t src, dst;
	uint32_t dst_buffer;
	/* a transit area holds pieces of several dtypes, each addressed in
	 * its own elements: only those of one size compare by offset */
	uint8_t esize;
	int64_t dst_offset, len;
	size_t piece;
};

static int flat_cmp(const void *a, const void *b)
{
	const struct flat *x = a, *y = b;
	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	if (x->dst != y->dst)
		return x->dst < y->dst ? -1 : 1;
	if (x->dst_buffer != y->dst_buffer)
		return x->dst_buffer < y->dst_buffer ? -1 : 1;
	if (x->esize != y->esize)
		return x->esize < y->esize ? -1 : 1;
	return x->dst_offset < y->dst_offset ? -1 : x->dst_offset > y->dst_offset;
}

static vps_result_t op_mismatch(size_t xi, size_t k, const struct vps_op *o, const char *why)
{
	return vps_fail(VPS_EFORMAT, "transfer %zu copy %zu (piece %" PRId64 "): %s (vps-verify(1) says more)", xi, k,
			o->piece, why);
}

struct staged_ctx {
	const struct vps_staged *s;
	const struct vps_query *q;
	const struct tensor_set *ts;
	struct vps_records *rec;
	struct name_cache nc;
	int64_t rank;
	struct flat *ix;
	size_t nix;
};

static bool piece_wanted(const struct staged_ctx *c, const struct vps_piece *pc)
{
	return tensor_in(c->ts, pc->tensor) && (c->q->state < 0 || pc->state == c->q->state);
}

static vps_result_t flat_op(struct staged_ctx *c, size_t xi, size_t k)
{
	const struct vps_xfer *x = &c->s->xfers[xi];
	const struct vps_op *o = &c->s->ops[x->first_op + k];
	const struct vps_plan *p = c->s->plan;
	/* a flat copy is one range: its elements in order on both sides */
	int64_t len = vps_ext_volume(o->ndim, o->ext);
	int64_t a0 = o->dst_offset, a1 = a0 + len, covered = 0;
	/* the first indexed piece past a0, then back one: the last piece of the
	 * pair that starts at or before a0 may reach into the copy */
	struct flat key = {x->src, x->dst, o->dst_buffer, o->esize, a0, 0, 0};
	size_t lo = 0, hi = c->nix;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (flat_cmp(&c->ix[mid], &key) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	size_t i = lo;
	if (i && c->ix[i - 1].src == x->src && c->ix[i - 1].dst == x->dst && c->ix[i - 1].dst_buffer == o->dst_buffer &&
	    c->ix[i - 1].esize == o->esize)
		i--;
	for (; i < c->nix; i++) {
		const struct flat *e = &c->ix[i];
		if (e->src != x->src || e->dst != x->dst || e->dst_buffer != o->dst_buffer || e->esize != o->esize ||
		    e->dst_offset >= a1)
			break;
		int64_t from = vps_max64(a0, e->dst_offset), to = vps_min64(a1, e->dst_offset + e->len);
		if (from >= to)
			continue;
		const struct vps_piece *pc = &p->pieces[e->piece];
		if (pc->src_buffer != o->src_buffer ||
		    o->src_offset + (from - a0) != pc->src_offset + (from - e->dst_offset) ||
		    o->esize != vps_dtype_size(vps_piece_dtype(pc)))
			return op_mismatch(xi, k, o, "its source is not that of the pieces at its destination");
		covered += to - from;
		if (!piece_wanted(c, pc))
			continue;
		int64_t ext[VPS_MAX_DIMS], starts[2 * VPS_MAX_DIMS];
		struct vps_box parts[2 * VPS_MAX_DIMS];
		for (int d = 0; d < pc->box.ndim; d++)
			ext[d] = pc->box.hi[d] - pc->box.lo[d];
		int np = vps_flat_range_boxes(pc->box.ndim, ext, from - e->dst_offset, to - e->dst_offset, parts,
					      starts);
		for (int j = 0; j < np; j++) {
			struct xrec r = {c->rank,	x->src, x->dst, pc->tensor, pc->state, pc->dtype, parts[j], pc->src_buffer,
					 pc->src_offset + starts[j], pc->dst_buffer, pc->dst_offset + starts[j],
					 x->stage,	x->chunk, (int64_t)e->piece};
			for (int d = 0; d < r.box.ndim; d++) {
				r.box.lo[d] += pc->box.lo[d];
				r.box.hi[d] += pc->box.lo[d];
			}
			VPS_CHECK(put_transfer(c->rec, vps_layout_model(p->a), &c->nc, &r));
		}
	}
	if (covered != len)
		return op_mismatch(xi, k, o, "its destination is not covered by flat pieces of its pair");
	return VPS_OK;
}

static vps_result_t staged_op(struct staged_ctx *c, size_t xi, size_t k)
{
	const struct vps_xfer *x = &c->s->xfers[xi];
	const struct vps_op *o = &c->s->ops[x->first_op + k];
	const struct vps_plan *p = c->s->plan;
	if (o->piece < 0 || (size_t)o->piece >= p->npieces)
		return op_mismatch(xi, k, o, "no such piece");
	const struct vps_piece *pc = &p->pieces[o->piece];
	struct vps_run run;
	struct vps_box sub;
	vps_op_run(x, o, &run);
	enum vps_match m = vps_piece_match(pc, &run, &sub);
	if (m == VPS_MATCH_FLAT)
		return flat_op(c, xi, k);
	if (m == VPS_MATCH_NONE && vps_piece_flat(pc))
		return op_mismatch(xi, k, o, "a copy of flat pieces that is not one contiguous range");
	if (m == VPS_MATCH_NONE || o->npieces != 1)
		return op_mismatch(xi, k, o, "not a part of the strided piece it names");
	if (!piece_wanted(c, pc))
		return VPS_OK;
	for (int d = 0; d < sub.ndim; d++) {
		sub.lo[d] += pc->box.lo[d];
		sub.hi[d] += pc->box.lo[d];
	}
	struct xrec r = {c->rank,      x->src,	      x->dst,	     pc->tensor, pc->state, pc->dtype, sub,
			 o->src_buffer, o->src_offset, o->dst_buffer, o->dst_offset, x->stage, x->chunk, o->piece};
	return put_transfer(c->rec, vps_layout_model(p->a), &c->nc, &r);
}

vps_result_t vps_query_staged(const struct vps_staged *s, const struct vps_query *q, enum vps_format f,
			      struct vps_bytes *out)
{
	const struct vps_plan *p = s->plan;
	const struct vps_model *m = vps_layout_model(p->a);
	struct tensor_set ts;
	struct vps_records rec;
	struct staged_ctx c = {.s = s, .q = q, .ts = &ts, .rec = &rec};
	vps_result_t rc;
	if (q->stage >= 0 && !s->cut)
		return vps_fail(VPS_EINPUT, "stage %" PRId64 ": this staged plan is not cut into stages yet (one rank's: its "
				"executors cut it when the switch starts)", q->stage);
	if (q->stage >= 0 && (size_t)q->stage >= s->nstages)
		return vps_fail(VPS_EINPUT, "stage %" PRId64 ": the staged plan has %zu stages (from 0)", q->stage,
				s->nstages);
	if (q->state >= 0 && !vps_layout_has_state(p->a, q->state))
		return no_state("this plan moves", p->a, q->state);
	if (!p->pieces && p->npieces)
		return vps_fail(VPS_EINTERNAL, "a staged plan's pieces are packed");
	VPS_CHECK(query_rank(q, s->scope, vps_world_size(p->world), "staged plan", &c.rank));
	VPS_CHECK(tensor_set_init(&ts, m, q->tensor, 0));
	size_t cap = 0;
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if ((x->src != c.rank && x->dst != c.rank) || !vps_piece_flat(x))
			continue;
		VPS_CHECK_GOTO(VPS_GROW(c.ix, cap, c.nix + 1), rc, done);
		c.ix[c.nix++] = (struct flat){x->src,	     x->dst, x->dst_buffer, (uint8_t)vps_dtype_size(vps_piece_dtype(x)),
					      x->dst_offset, vps_box_volume(&x->box), i};
	}
	if (c.nix)
		qsort(c.ix, c.nix, sizeof(*c.ix), flat_cmp);
	VPS_CHECK_GOTO(vps_records_begin(&rec, out, f, vps_transfer_fields, vps_transfer_nfields), rc, done);
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (!pair_wanted(q, c.rank, x->src, x->dst) || (q->stage >= 0 && x->stage != q->stage))
			continue;
		for (size_t k = 0; k < x->nops; k++)
			VPS_CHECK_GOTO(staged_op(&c, i, k), rc, done);
	}
	rc = vps_records_end(&rec);
done:
	free(c.ix);
	tensor_set_release(&ts);
	return rc;
}

vps_result_t vps_query_document(const char *name, const void *data, size_t len, const struct vps_query *q,
				enum vps_format f, struct vps_bytes *out)
{
	enum vps_doc_kind kind = vps_doc_sniff(data, len);
	vps_result_t rc;
	if (kind == VPS_DOC_PLAN) {
		struct vps_plan *p;
		/* read in order once: a global plan's pieces may stay packed */
		VPS_CHECK(vps_plan_parse_as(&p, name, data, len, true));
		rc = vps_query_transfers(p, q, f, out);
		vps_plan_free(p);
		return rc;
	}
	if (kind == VPS_DOC_STAGED) {
		struct vps_staged *s;
		VPS_CHECK(vps_staged_parse(&s, name, data, len));
		rc = vps_query_staged(s, q, f, out);
		/* a copy that does not lie in its pieces is the file's fault */
		if (rc == VPS_EFORMAT)
			vps_error_prefix("%s", name);
		vps_staged_free(s);
		return rc;
	}
	if (kind)
		return vps_doc_wrong_kind(name, kind, VPS_DOC_BIT(VPS_DOC_PLAN) | VPS_DOC_BIT(VPS_DOC_STAGED));
	return vps_fail(VPS_EINPUT, "%s: not a vps plan or staged plan", name);
}
