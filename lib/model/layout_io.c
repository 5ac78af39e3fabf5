#include <inttypes.h>
#include <stdio.h>

#include "io/doc.h"
#include "util/internal.h"
#include "model/layout_int.h"
#include "model/layout_io.h"
#include "model/model_io.h"
#include "model/parallel_io.h"

static void param_name(const struct vps_layout *l, const struct vps_rank_view *v, size_t region, char *buf,
		       size_t n)
{
	if (v->region_names) {
		snprintf(buf, n, "%s", v->region_names[region]);
		return;
	}
	vps_layout_param_name(l, &v->params[v->region_param[region]], buf, n);
}

static vps_result_t write_box(struct vps_writer *w, const char *key, const int64_t *lo, const int64_t *hi, int ndim)
{
	VPS_CHECK(vps_w_seq_begin(w, key, (uint64_t)ndim, true));
	for (int k = 0; k < ndim; k++) {
		VPS_CHECK(vps_w_seq_begin(w, NULL, 2, true));
		VPS_CHECK(vps_w_int(w, NULL, lo[k]));
		VPS_CHECK(vps_w_int(w, NULL, hi[k]));
		VPS_CHECK(vps_w_seq_end(w));
	}
	return vps_w_seq_end(w);
}

vps_result_t vps_box_write(struct vps_writer *w, const char *key, const struct vps_box *b)
{
	return write_box(w, key, b->lo, b->hi, b->ndim);
}

vps_result_t vps_box_read(struct vps_reader *r, const char *key, struct vps_box *b)
{
	uint64_t n;
	memset(b, 0, sizeof(*b));
	VPS_CHECK(vps_r_seq_begin(r, key, &n));
	if (n < 1 || n > VPS_MAX_DIMS)
		return vps_r_error(r, key, "a box has 1 to %d axes", VPS_MAX_DIMS);
	b->ndim = (int)n;
	for (uint64_t k = 0; k < n; k++) {
		uint64_t two;
		VPS_CHECK(vps_r_seq_begin(r, NULL, &two));
		if (two != 2)
			return vps_r_error(r, key, "each axis of a box is [lo, hi]");
		VPS_CHECK(vps_r_int(r, NULL, &b->lo[k], 0, VPS_MAX_ELEMENTS));
		VPS_CHECK(vps_r_int(r, NULL, &b->hi[k], 0, VPS_MAX_ELEMENTS));
		VPS_CHECK(vps_r_seq_end(r));
	}
	return vps_r_seq_end(r);
}

bool vps_box_ok(const struct vps_box *b, const struct vps_tensor *t)
{
	if (b->ndim != t->ndim)
		return false;
	for (int k = 0; k < b->ndim; k++)
		if (b->lo[k] >= b->hi[k] || b->hi[k] > t->shape[k])
			return false;
	return true;
}

vps_result_t vps_box_check(struct vps_reader *r, const char *key, const char *what, const struct vps_box *b,
			   const struct vps_tensor *t)
{
	char tn[256];
	if (vps_box_ok(b, t))
		return VPS_OK;
	if (b->ndim != t->ndim)
		return vps_r_error(r, key, "%s: %d axes, but the tensor has %d", what, b->ndim, t->ndim);
	for (int k = 0; k < b->ndim; k++)
		if (b->lo[k] >= b->hi[k] || b->hi[k] > t->shape[k]) {
			vps_tensor_name(t, tn, sizeof(tn));
			return vps_r_error(r, key,
					   "%s: axis %d [%" PRId64 ", %" PRId64 ") is empty or outside %s (%" PRId64 " long)",
					   what, k, b->lo[k], b->hi[k], tn, t->shape[k]);
		}
	return VPS_OK;
}

bool vps_view_ok(int ndim, const int64_t *ext, int64_t offset, const int64_t *strides, int64_t elements)
{
	int64_t first, end;
	for (int k = 0; k < ndim; k++)
		if (strides[k] == 0)
			return false;
	return vps_view_span(ndim, ext, offset, strides, &first, &end) && first >= 0 && end <= VPS_MAX_ELEMENTS &&
	       (elements < 0 || end <= elements);
}

vps_result_t vps_view_check(struct vps_reader *r, const char *key, const char *what, int ndim, const int64_t *ext,
			    int64_t offset, const int64_t *strides, uint32_t buffer, int64_t elements)
{
	int64_t first, end;
	if (vps_view_ok(ndim, ext, offset, strides, elements))
		return VPS_OK;
	for (int k = 0; k < ndim; k++)
		if (strides[k] == 0)
			return vps_r_error(r, key, "%s: stride %d is 0 (rows that alias each other)", what, k);
	if (!vps_view_span(ndim, ext, offset, strides, &first, &end) || first < 0 || end > VPS_MAX_ELEMENTS)
		return vps_r_error(r, key, "%s: the view reaches beyond 2^48 elements, more than any buffer holds", what);
	if (elements >= 0 && end > elements)
		return vps_r_error(r, key, "%s: elements [%" PRId64 ", %" PRId64 ") lie outside buffer %u of %" PRId64
				   " elements", what, first, end, buffer, elements);
	return VPS_OK;
}

vps_result_t vps_ints_write(struct vps_writer *w, const char *key, const int64_t *v, int n)
{
	VPS_CHECK(vps_w_seq_begin(w, key, (uint64_t)n, true));
	for (int k = 0; k < n; k++)
		VPS_CHECK(vps_w_int(w, NULL, v[k]));
	return vps_w_seq_end(w);
}

/* A buffer's group as files name it. */
static const char *group_name(const struct vps_buffer *b)
{
	if (b->state == VPS_STATE_MODULE)
		return "module";
	if (b->layerwise)
		return b->expert ? "expert_layerwise" : "dense_layerwise";
	return b->expert ? "expert" : "dense";
}

static vps_result_t write_view(const struct vps_layout *l, struct vps_writer *w, const struct vps_rank_view *v)
{
	char name[256];
	VPS_CHECK(vps_w_map_begin(w, NULL));
	VPS_CHECK(vps_w_int(w, "rank", v->rank));
	int64_t dev[2] = {v->device.node, v->device.gpu};
	VPS_CHECK(vps_ints_write(w, "device", dev, 2));
	VPS_CHECK(vps_w_map_begin(w, "coords"));
	VPS_CHECK(vps_w_int(w, "tp", v->coords.tp));
	VPS_CHECK(vps_w_int(w, "cp", v->coords.cp));
	VPS_CHECK(vps_w_int(w, "dp", v->coords.dp));
	VPS_CHECK(vps_w_int(w, "pp", v->coords.pp));
	VPS_CHECK(vps_w_int(w, "etp", v->coords.etp));
	VPS_CHECK(vps_w_int(w, "ep", v->coords.ep));
	VPS_CHECK(vps_w_int(w, "edp", v->coords.edp));
	VPS_CHECK(vps_w_map_end(w));
	VPS_CHECK(vps_w_seq_begin(w, "buffers", v->nbuffers, false));
	for (size_t i = 0; i < v->nbuffers; i++) {
		const struct vps_buffer *b = &v->buffers[i];
		VPS_CHECK(vps_w_map_begin(w, NULL));
		VPS_CHECK(vps_w_int(w, "id", b->id));
		VPS_CHECK(vps_w_str(w, "state", vps_state_name(b->state)));
		VPS_CHECK(vps_w_str(w, "dtype", vps_dtype_name(b->dtype)));
		VPS_CHECK(vps_w_int(w, "chunk", b->chunk));
		VPS_CHECK(vps_w_str(w, "group", group_name(b)));
		VPS_CHECK(vps_w_bool(w, "sharded", b->sharded));
		VPS_CHECK(vps_w_bool_sparse(w, "host", b->host, false));
		VPS_CHECK(vps_w_int(w, "elements", b->elements));
		VPS_CHECK(vps_w_map_end(w));
	}
	VPS_CHECK(vps_w_seq_end(w));
	VPS_CHECK(vps_w_seq_begin(w, "regions", v->nregions, false));
	for (size_t i = 0; i < v->nregions; i++) {
		const struct vps_region *r = &v->regions[i];
		struct vps_tensor t;
		VPS_CHECK(vps_model_tensor(&l->m, r->tensor, &t));
		VPS_CHECK(vps_w_map_begin(w, NULL));
		vps_tensor_name(&t, name, sizeof(name));
		VPS_CHECK(vps_w_str(w, "tensor", name));
		param_name(l, v, i, name, sizeof(name));
		VPS_CHECK(vps_w_str(w, "param", name));
		VPS_CHECK(vps_w_str(w, "state", vps_state_name(r->state)));
		VPS_CHECK(vps_w_int(w, "buffer", r->buffer));
		VPS_CHECK(vps_box_write(w, "box", &r->box));
		VPS_CHECK(vps_w_int(w, "offset", r->offset));
		VPS_CHECK(vps_ints_write(w, "strides", r->strides, r->box.ndim));
		VPS_CHECK(vps_w_map_end(w));
	}
	VPS_CHECK(vps_w_seq_end(w));
	return vps_w_map_end(w);
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

vps_result_t vps_layout_write(struct vps_writer *w, const struct vps_layout *l, const int64_t *ranks, size_t nranks)
{
	vps_result_t rc = VPS_OK;
	size_t n = l->nex + nranks;
	int64_t *all = vps_malloc(n * sizeof(*all) + 1);
	if (!all)
		return VPS_ENOMEM;
	for (size_t i = 0; i < l->nex; i++)
		all[i] = l->ex[i].rank;
	for (size_t i = 0; i < nranks; i++) {
		if (ranks[i] < 0 || ranks[i] >= l->world) {
			free(all);
			return vps_fail(VPS_EINPUT, "rank %" PRId64 " is outside the world of %" PRId64 " ranks", ranks[i],
					l->world);
		}
		all[l->nex + i] = ranks[i];
	}
	qsort(all, n, sizeof(*all), cmp_i64);
	size_t u = 0;
	for (size_t i = 0; i < n; i++)
		if (!u || all[u - 1] != all[i])
			all[u++] = all[i];
	VPS_CHECK_GOTO(vps_w_u64hex(w, "hash", vps_layout_hash(l)), rc, done);
	VPS_CHECK_GOTO(vps_model_write(w, "model", &l->m), rc, done);
	VPS_CHECK_GOTO(vps_parallel_write(w, "parallel", &l->p), rc, done);
	VPS_CHECK_GOTO(vps_devices_write(w, "devices", &l->d), rc, done);
	VPS_CHECK_GOTO(vps_w_seq_begin(w, "ranks", u, false), rc, done);
	for (size_t i = 0; i < u; i++) {
		struct vps_rank_view v;
		VPS_CHECK_GOTO(vps_layout_rank(l, all[i], &v), rc, done);
		rc = write_view(l, w, &v);
		vps_rank_view_release(&v);
		if (rc)
			goto done;
	}
	rc = vps_w_seq_end(w);
done:
	free(all);
	return rc;
}

vps_result_t vps_layout_serialize(const struct vps_layout *l, const int64_t *ranks, size_t nranks, bool yaml,
				  struct vps_bytes *out)
{
	struct vps_writer *w;
	VPS_CHECK(vps_writer_new(&w, VPS_DOC_LAYOUT, yaml));
	vps_result_t rc = vps_layout_write(w, l, ranks, nranks);
	if (!rc)
		rc = vps_writer_finish(w, out);
	vps_writer_free(w);
	return rc;
}

/* A view's rank, its device (the device map's) and its coordinates. */
static vps_result_t read_view_rank(struct vps_reader *r, const struct vps_layout *l, struct vps_rank_view *v)
{
	uint64_t n;
	int64_t node, gpu;
	VPS_CHECK(vps_r_int(r, "rank", &v->rank, 0, l->world - 1));
	VPS_CHECK(vps_r_seq_begin(r, "device", &n));
	if (n != 2)
		return vps_r_error(r, "device", "a device is [node, gpu]");
	VPS_CHECK(vps_r_int(r, NULL, &node, 0, INT32_MAX));
	VPS_CHECK(vps_r_int(r, NULL, &gpu, 0, INT32_MAX));
	VPS_CHECK(vps_r_seq_end(r));
	v->device.node = (int32_t)node;
	v->device.gpu = (int32_t)gpu;
	struct vps_device want = vps_layout_device(l, v->rank);
	if (want.node != v->device.node || want.gpu != v->device.gpu)
		return vps_r_error(r, "device", "rank %" PRId64 " is on node %d gpu %d in the device map", v->rank,
				   want.node, want.gpu);
	VPS_CHECK(vps_r_map_begin(r, "coords"));
	VPS_CHECK(vps_r_int(r, "tp", &v->coords.tp, 0, INT32_MAX));
	/* views written before cp= existed have none: context parallel rank 0 */
	VPS_CHECK(vps_r_int_opt(r, "cp", &v->coords.cp, 0, INT32_MAX, 0));
	VPS_CHECK(vps_r_int(r, "dp", &v->coords.dp, 0, INT32_MAX));
	VPS_CHECK(vps_r_int(r, "pp", &v->coords.pp, 0, INT32_MAX));
	VPS_CHECK(vps_r_int(r, "etp", &v->coords.etp, 0, INT32_MAX));
	VPS_CHECK(vps_r_int(r, "ep", &v->coords.ep, 0, INT32_MAX));
	VPS_CHECK(vps_r_int(r, "edp", &v->coords.edp, 0, INT32_MAX));
	return vps_r_map_end(r);
}

/* Buffer i of a view. */
static vps_result_t read_buffer(struct vps_reader *r, const struct vps_layout *l, uint64_t i, struct vps_buffer *b)
{
	const char *s;
	int64_t x;
	int e;
	VPS_CHECK(vps_r_map_begin(r, NULL));
	VPS_CHECK(vps_r_int(r, "id", &x, (int64_t)i, (int64_t)i));
	b->id = (uint32_t)x;
	VPS_CHECK(vps_r_str(r, "state", &s));
	if (vps_state_parse(s, &e))
		return vps_r_error(r, "state", "unknown state '%s'", s);
	b->state = (uint8_t)e;
	VPS_CHECK(vps_r_str(r, "dtype", &s));
	if (vps_dtype_parse(s, &e))
		return vps_r_error(r, "dtype", "unknown dtype '%s' (bf16, fp32 or int16)", s);
	b->dtype = (uint8_t)e;
	VPS_CHECK(vps_r_int(r, "chunk", &x, 0, l->p.vpp - 1));
	b->chunk = (int32_t)x;
	VPS_CHECK(vps_r_str(r, "group", &s));
	/* module buffers are a group of their own, with the one state */
	static const char *const groups[] = {"dense", "expert", "dense_layerwise", "expert_layerwise", "module"};
	size_t g = 0;
	while (g < sizeof(groups) / sizeof(groups[0]) && strcmp(s, groups[g]))
		g++;
	bool module = g == 4;
	if (g == sizeof(groups) / sizeof(groups[0]) || module != (b->state == VPS_STATE_MODULE))
		return vps_r_error(r, "group", "'%s' with state %s: expected dense, expert, dense_layerwise or "
			       "expert_layerwise, or module with module_buffer", s, vps_state_name(b->state));
	b->expert = g == 1 || g == 3;
	b->layerwise = g == 2 || g == 3;
	VPS_CHECK(vps_r_bool(r, "sharded", &b->sharded));
	if (vps_reader_has(r, VPS_FEATURE_OFFLOAD))
		VPS_CHECK(vps_r_bool_sparse(r, "host", &b->host, false));
	else if (vps_reader_echo_writer(r))
		VPS_CHECK(vps_w_bool_sparse(vps_reader_echo_writer(r), "host", false, false));
	VPS_CHECK(vps_r_int(r, "elements", &b->elements, 0, VPS_MAX_ELEMENTS));
	return vps_r_map_end(r);
}

/* Region i of a view: a state its tensor has, a box inside the tensor, a
 * view inside its buffer. Counted in v->nregions once its name is held,
 * for vps_rank_view_release. */
static vps_result_t read_region(struct vps_reader *r, const struct vps_layout *l, struct vps_rank_view *v, uint64_t i)
{
	struct vps_region *g = &v->regions[i];
	const char *s;
	uint32_t id;
	int e;
	int64_t x;
	VPS_CHECK(vps_r_map_begin(r, NULL));
	VPS_CHECK(vps_r_str(r, "tensor", &s));
	if (vps_model_find_tensor(&l->m, s, &id))
		return vps_r_error(r, "tensor", "no tensor '%s' in model %s", s, l->m.name);
	g->tensor = id;
	VPS_CHECK(vps_r_str(r, "param", &s));
	v->region_names[i] = vps_strdup(s);
	v->nregions++;
	if (!v->region_names[i])
		return VPS_ENOMEM;
	v->region_param[i] = UINT32_MAX;
	VPS_CHECK(vps_r_str(r, "state", &s));
	if (vps_state_parse(s, &e))
		return vps_r_error(r, "state", "unknown state '%s'", s);
	g->state = (uint8_t)e;
	VPS_CHECK(vps_r_int(r, "buffer", &x, 0, (int64_t)v->nbuffers - 1));
	g->buffer = (uint32_t)x;
	g->dtype = vps_dtype_field(v->buffers[x].dtype);
	VPS_CHECK(vps_box_read(r, "box", &g->box));
	struct vps_tensor t;
	char what[64];
	snprintf(what, sizeof(what), "rank %" PRId64 " region %" PRIu64, v->rank, i);
	vps_model_tensor(&l->m, id, &t);
	if (!vps_layout_tensor_has_state(l, &t, g->state))
		return vps_r_error(r, "state", "%s is %s, which has no state %s", what,
				   t.module_buffer ? "a module buffer" : "a parameter", vps_state_name(g->state));
	VPS_CHECK(vps_box_check(r, "box", what, &g->box, &t));
	VPS_CHECK(vps_r_int(r, "offset", &g->offset, 0, VPS_MAX_ELEMENTS));
	uint64_t ns;
	VPS_CHECK(vps_r_seq_begin(r, "strides", &ns));
	if (ns != (uint64_t)g->box.ndim)
		return vps_r_error(r, "strides", "one stride per axis of the box");
	for (uint64_t k = 0; k < ns; k++)
		VPS_CHECK(vps_r_int(r, NULL, &g->strides[k], -VPS_MAX_ELEMENTS, VPS_MAX_ELEMENTS));
	VPS_CHECK(vps_r_seq_end(r));
	int64_t ext[VPS_MAX_DIMS];
	for (int k = 0; k < g->box.ndim; k++)
		ext[k] = g->box.hi[k] - g->box.lo[k];
	VPS_CHECK(vps_view_check(r, "strides", what, g->box.ndim, ext, g->offset, g->strides, g->buffer,
				 v->buffers[g->buffer].elements));
	return vps_r_map_end(r);
}

static vps_result_t read_view(struct vps_reader *r, const struct vps_layout *l, struct vps_rank_view *v)
{
	vps_result_t rc = VPS_OK;
	uint64_t n;
	memset(v, 0, sizeof(*v));
	VPS_CHECK(vps_r_map_begin(r, NULL));
	VPS_CHECK_GOTO(read_view_rank(r, l, v), rc, fail);
	VPS_CHECK_GOTO(vps_r_seq_begin(r, "buffers", &n), rc, fail);
	v->buffers = vps_calloc(n + 1, sizeof(*v->buffers));
	if (!v->buffers) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	for (uint64_t i = 0; i < n; i++) {
		VPS_CHECK_GOTO(read_buffer(r, l, i, &v->buffers[i]), rc, fail);
		v->nbuffers++;
	}
	VPS_CHECK_GOTO(vps_r_seq_end(r), rc, fail);
	VPS_CHECK_GOTO(vps_r_seq_begin(r, "regions", &n), rc, fail);
	v->regions = vps_calloc(n + 1, sizeof(*v->regions));
	v->region_param = vps_calloc(n + 1, sizeof(*v->region_param));
	v->region_names = vps_calloc(n + 1, sizeof(*v->region_names));
	if (!v->regions || !v->region_param || !v->region_names) {
		rc = VPS_ENOMEM;
		goto fail;
	}
	for (uint64_t i = 0; i < n; i++)
		VPS_CHECK_GOTO(read_region(r, l, v, i), rc, fail);
	VPS_CHECK_GOTO(vps_r_seq_end(r), rc, fail);
	VPS_CHECK_GOTO(vps_r_map_end(r), rc, fail);
	return VPS_OK;
fail:
	vps_rank_view_release(v);
	return rc;
}

vps_result_t vps_layout_read(struct vps_reader *r, struct vps_layout **out)
{
	uint64_t stated;
	return vps_layout_read_stated(r, out, &stated);
}

vps_result_t vps_layout_read_stated(struct vps_reader *r, struct vps_layout **out, uint64_t *stated)
{
	struct vps_model m;
	struct vps_parallel p;
	struct vps_devices d = {0};
	struct vps_layout *l = NULL;
	vps_result_t rc;
	uint64_t hash, n;
	char where[512];
	VPS_CHECK(vps_r_u64hex(r, "hash", &hash));
	*stated = hash;
	VPS_CHECK(vps_model_read(r, "model", &m));
	snprintf(where, sizeof(where), "%s: line %d: parallel", vps_reader_name(r), vps_r_line(r, "parallel"));
	if (vps_reader_is_binary(r))
		snprintf(where, sizeof(where), "%s: parallel", vps_reader_name(r));
	VPS_CHECK(vps_parallel_read(r, "parallel", &p));
	VPS_CHECK_GOTO(vps_devices_read(r, "devices", &d), rc, fail);
	VPS_CHECK_GOTO(vps_layout_new(&l, &m, &p, &d, where), rc, fail);
	VPS_CHECK_GOTO(vps_r_seq_begin(r, "ranks", &n), rc, fail);
	for (uint64_t i = 0; i < n; i++) {
		struct vps_rank_view v;
		VPS_CHECK_GOTO(read_view(r, l, &v), rc, fail);
		if (vps_layout_set_explicit(l, &v)) {
			vps_rank_view_release(&v);
			rc = VPS_ENOMEM;
			goto fail;
		}
	}
	VPS_CHECK_GOTO(vps_r_seq_end(r), rc, fail);
	vps_devices_release(&d);
	*out = l;
	return VPS_OK;
fail:
	vps_devices_release(&d);
	vps_layout_free(l);
	return rc;
}

vps_result_t vps_layout_parse(struct vps_layout **out, const char *name, const void *data, size_t len)
{
	struct vps_reader *r;
	VPS_CHECK(vps_reader_new(&r, name, data, len, VPS_DOC_LAYOUT));
	vps_result_t rc = vps_layout_read(r, out);
	if (!rc) {
		rc = vps_reader_finish(r);
		if (rc) {
			vps_layout_free(*out);
			*out = NULL;
		}
	}
	vps_reader_free(r);
	return rc;
}

vps_result_t vps_layout_load(struct vps_layout **out, const char *path)
{
	struct vps_bytes b;
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_layout_parse(out, path && strcmp(path, "-") ? path : "<stdin>", b.data, b.len);
	vps_bytes_release(&b);
	return rc;
}
