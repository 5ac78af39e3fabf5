/* In-memory jobs for tests: every rank's buffers of a layout on the host,
 * filled with the pattern, checked element by element. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jobs.h"
#include "vps/data.h"


struct vps_layout *test_layout(const char *model, const char *spec, int64_t gpus_per_node, int64_t first_node)
{
	struct vps_model m;
	struct vps_parallel p;
	struct vps_devices d;
	struct vps_layout *l = NULL;
	CHECK_OK(vps_model_load(&m, model, CONFIGS "/models"));
	vps_parallel_init(&p);
	CHECK_OK(vps_parallel_parse(&p, spec, "test"));
	vps_devices_packed(&d, gpus_per_node, first_node);
	CHECK_OK(vps_layout_new(&l, &m, &p, &d, "test"));
	return l;
}

uint32_t test_tensor_id(const struct vps_layout *l, const char *name)
{
	uint32_t id = UINT32_MAX;
	CHECK_OK(vps_model_find_tensor(vps_layout_model(l), name, &id));
	return id;
}

int64_t test_view_held(const struct vps_rank_view *v, uint32_t tensor, int state, int64_t *first)
{
	int64_t n = 0;
	*first = -1;
	for (size_t i = 0; i < v->nregions; i++) {
		const struct vps_region *r = &v->regions[i];
		if (r->tensor != tensor || r->state != state)
			continue;
		n += vps_box_volume(&r->box);
		if (*first < 0 || r->offset < *first)
			*first = r->offset;
	}
	return n;
}

uint64_t test_holder_set(const struct vps_layout *l, uint32_t tensor, int state)
{
	struct vps_holders h = {0};
	uint64_t set = 0;
	CHECK_OK(vps_layout_holders(l, tensor, state, NULL, &h));
	for (size_t i = 0; i < h.n; i++)
		for (int64_t k = 0; k < h.v[i].count; k++)
			set |= (uint64_t)1 << (h.v[i].base + k * h.v[i].stride);
	vps_holders_release(&h);
	return set;
}

struct flat {
	uint32_t tensor;
	uint8_t state;
	int64_t rank, offset;
	uint32_t buffer;
	struct vps_box box;
};

static int flat_cmp(const void *a, const void *b)
{
	const struct flat *x = a, *y = b;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	if (x->state != y->state)
		return x->state < y->state ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->buffer != y->buffer)
		return x->buffer < y->buffer ? -1 : 1;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return vps_box_order(&x->box, &y->box);
}

static void push_flat(struct flat **a, size_t *n, size_t *cap, struct flat f)
{
	if (*n == *cap)
		*a = realloc(*a, (*cap = *cap ? *cap * 2 : 1024) * sizeof(**a));
	(*a)[(*n)++] = f;
}

void test_holders_match(const char *model, const char *spec)
{
	struct vps_layout *l = test_layout(model, spec, 8, 0);
	if (!l)
		return;
	struct flat *a = NULL, *b = NULL;
	size_t na = 0, nb = 0, ca = 0, cb = 0;
	for (int64_t r = 0; r < vps_layout_world(l); r++) {
		struct vps_rank_view v;
		CHECK_OK(vps_layout_rank(l, r, &v));
		for (size_t i = 0; i < v.nregions; i++)
			push_flat(&a, &na, &ca, (struct flat){v.regions[i].tensor, v.regions[i].state, r, v.regions[i].offset,
							      v.regions[i].buffer, v.regions[i].box});
		vps_rank_view_release(&v);
	}
	const struct vps_model *m = vps_layout_model(l);
	for (uint32_t t = 0; t < vps_model_num_tensors(m); t++)
		for (int st = 0; st < VPS_NSTATES; st++) {
			struct vps_holders h = {0};
			CHECK_OK(vps_layout_holders(l, t, st, NULL, &h));
			for (size_t i = 0; i < h.n; i++)
				for (int64_t k = 0; k < h.v[i].count; k++)
					push_flat(&b, &nb, &cb, (struct flat){t, (uint8_t)st, h.v[i].base + k * h.v[i].stride,
									      h.v[i].region.offset, h.v[i].region.buffer,
									      h.v[i].region.box});
			vps_holders_release(&h);
		}
	qsort(a, na, sizeof(*a), flat_cmp);
	qsort(b, nb, sizeof(*b), flat_cmp);
	size_t bad = na == nb ? 0 : 1;
	for (size_t i = 0; i < na && i < nb; i++)
		bad += flat_cmp(&a[i], &b[i]) != 0;
	if (bad)
		harness_fail(__FILE__, __LINE__, "%s %s: %zu of %zu holder entries differ from the %zu enumerated", model,
			     spec, bad, nb, na);
	free(a);
	free(b);
	vps_layout_free(l);
}

void job_alloc(struct job *j, const struct vps_layout *l)
{
	j->l = l;
	j->n = vps_layout_world(l);
	j->views = calloc((size_t)j->n, sizeof(*j->views));
	j->bufs = calloc((size_t)j->n, sizeof(*j->bufs));
	for (int64_t r = 0; r < j->n; r++) {
		CHECK_OK(vps_layout_rank(l, r, &j->views[r]));
		j->bufs[r] = calloc(j->views[r].nbuffers + 1, sizeof(*j->bufs[r]));
		for (size_t b = 0; b < j->views[r].nbuffers; b++)
			j->bufs[r][b] = calloc((size_t)j->views[r].buffers[b].elements + 1,
					       vps_dtype_size(j->views[r].buffers[b].dtype));
	}
}

void job_free(struct job *j)
{
	for (int64_t r = 0; r < j->n; r++) {
		for (size_t b = 0; b < j->views[r].nbuffers; b++)
			free(j->bufs[r][b]);
		free(j->bufs[r]);
		vps_rank_view_release(&j->views[r]);
	}
	free(j->views);
	free(j->bufs);
}

void job_fill(struct job *j)
{
	const struct vps_model *m = vps_layout_model(j->l);
	for (int64_t r = 0; r < j->n; r++)
		for (size_t i = 0; i < j->views[r].nregions; i++) {
			const struct vps_region *g = &j->views[r].regions[i];
			struct vps_tensor t;
			vps_model_tensor(m, g->tensor, &t);
			vps_fill_region(j->bufs[r][g->buffer], g, &t, 0);
		}
}

/* Elements of B that are wrong, padding that is not zero. */
int64_t job_check(struct job *j)
{
	const struct vps_model *m = vps_layout_model(j->l);
	int64_t bad = 0;
	for (int64_t r = 0; r < j->n; r++) {
		for (size_t i = 0; i < j->views[r].nregions; i++) {
			const struct vps_region *g = &j->views[r].regions[i];
			struct vps_tensor t;
			vps_model_tensor(m, g->tensor, &t);
			bad += vps_check_region(j->bufs[r][g->buffer], g, &t, 0);
		}
		/* padding: zero everywhere no region covers */
		for (size_t b = 0; b < j->views[r].nbuffers; b++) {
			int64_t el = j->views[r].buffers[b].elements;
			size_t es = vps_dtype_size(j->views[r].buffers[b].dtype);
			unsigned char *covered = calloc((size_t)el + 1, 1);
			for (size_t i = 0; i < j->views[r].nregions; i++) {
				const struct vps_region *g = &j->views[r].regions[i];
				if (g->buffer != b)
					continue;
				int64_t first, end;
				vps_region_extent(g, &first, &end);
				memset(covered + first, 1, (size_t)(end - first));
			}
			for (int64_t e = 0; e < el; e++)
				if (!covered[e])
					for (size_t k = 0; k < es; k++)
						bad += j->bufs[r][b][(size_t)e * es + k] != 0;
			free(covered);
		}
	}
	return bad;
}

void job_apply_plan(const struct vps_plan *p, struct job *a, struct job *b)
{
	/* each world rank's transit area, as vps-exec sizes it */
	int64_t W = vps_world_size(p->world);
	unsigned char **area = calloc((size_t)W, sizeof(*area));
	CHECK(area != NULL);
	for (int64_t w = 0; area && w < W; w++) {
		int64_t bytes = 0;
		CHECK_OK(vps_plan_transit_bytes(p, w, &bytes));
		area[w] = bytes ? calloc((size_t)bytes, 1) : NULL;
	}
	/* forwards (a relay passing on from its target buffers or its transit
	 * area) after the direct pieces, each hop after the one before */
	for (size_t n = 0; area && n < (VPS_MAX_HOP + 1) * p->npieces; n++) {
		const struct vps_piece *x = &p->pieces[n % p->npieces];
		bool forward = x->src_buffer & VPS_BUFFER_TARGET;
		if (vps_buffer_hop(x->src_buffer) != (int)(n / p->npieces))
			continue;
		int64_t ra = forward ? vps_world_b_rank(p->world, x->src) : vps_world_a_rank(p->world, x->src),
			rb = vps_world_b_rank(p->world, x->dst);
		if (vps_piece_from_transit(x))
			ra = x->src;
		if (vps_piece_to_transit(x))
			rb = x->dst;
		CHECK(ra >= 0 && rb >= 0);
		if (ra < 0 || rb < 0)
			continue;
		unsigned char *from = vps_piece_from_transit(x) ? area[ra]
				      : forward ? b->bufs[ra][vps_buffer_index(x->src_buffer)]
						: a->bufs[ra][x->src_buffer];
		unsigned char *to = vps_piece_to_transit(x) ? area[rb] : b->bufs[rb][x->dst_buffer];
		CHECK(from && to);
		if (!from || !to)
			continue;
		size_t es = vps_dtype_size(vps_piece_dtype(x));
		int64_t ext[VPS_MAX_DIMS];
		for (int k = 0; k < x->box.ndim; k++)
			ext[k] = x->box.hi[k] - x->box.lo[k];
		vps_copy_strided(to + (size_t)x->dst_offset * es, x->dst_strides, from + (size_t)x->src_offset * es,
				 x->src_strides, ext, x->box.ndim, es);
	}
	for (int64_t w = 0; area && w < W; w++)
		free(area[w]);
	free(area);
}

void job_plan_exact(const struct vps_plan *p, const char *what)
{
	struct job ja, jb;
	job_alloc(&ja, p->a);
	job_alloc(&jb, p->b);
	job_fill(&ja);
	job_apply_plan(p, &ja, &jb);
	int64_t bad = job_check(&jb);
	if (bad)
		harness_fail(__FILE__, __LINE__, "%s: %lld wrong elements", what, (long long)bad);
	struct vps_plan_stats s;
	CHECK_OK(vps_plan_stats(p, NULL, false, &s));
	/* what lands in transit areas moves twice, on purpose */
	if (s.bytes_moved - s.bytes_transit != s.bytes_lower_bound)
		harness_fail(__FILE__, __LINE__, "%s: moved %lld (%lld through transit areas), lower bound %lld", what,
			     (long long)s.bytes_moved, (long long)s.bytes_transit, (long long)s.bytes_lower_bound);
	vps_plan_stats_release(&s);
	job_free(&ja);
	job_free(&jb);
}

bool job_piece_eq(const struct vps_piece *x, const struct vps_piece *y)
{
	return x->src == y->src && x->dst == y->dst && x->tensor == y->tensor && x->state == y->state &&
	       vps_box_equal(&x->box, &y->box) && x->src_buffer == y->src_buffer && x->dst_buffer == y->dst_buffer &&
	       x->src_offset == y->src_offset && x->dst_offset == y->dst_offset;
}

bool job_rank_part(const struct vps_plan *p, const struct vps_plan *q, int64_t r, size_t *want)
{
	size_t k = 0;
	bool same = true;
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		if (x->src != r && x->dst != r)
			continue;
		if (k >= q->npieces || !job_piece_eq(x, &q->pieces[k]))
			same = false;
		k++;
	}
	*want = k;
	return same && k == q->npieces;
}
