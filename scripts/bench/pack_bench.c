/* Pack and unpack throughput against plain memcpy of the same bytes.
 *
 * usage: pack_bench STAGED RANK [RUNS]
 *
 * For world rank RANK of a staged plan: pack every transfer it sends
 * (source views -> a staging buffer, as the GPU transports and the bounce
 * path do) and unpack every transfer it receives (staging -> destination
 * views), against memcpy of the same byte counts between two buffers of the
 * same sizes. Runs alternate (pack, memcpy, unpack, memcpy); medians. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vps/data.h"
#include "vps/stage.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp);
	return v[n / 2];
}

static unsigned char **alloc_view(const struct vps_rank_view *v)
{
	unsigned char **b = calloc(v->nbuffers + 1, sizeof(*b));
	for (size_t i = 0; i < v->nbuffers; i++) {
		size_t n = (size_t)v->buffers[i].elements * vps_dtype_size(v->buffers[i].dtype);
		b[i] = malloc(n + 1);
		memset(b[i], 1, n);
	}
	return b;
}

/* One pass: pack (sending) or unpack (receiving) every transfer of rank. */
static double pass(const struct vps_staged *s, int64_t rank, bool sending, unsigned char **bufs, unsigned char *stage,
		   int64_t *bytes)
{
	double t0 = now();
	*bytes = 0;
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (x->src == x->dst || (sending ? x->src : x->dst) != rank)
			continue;
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &s->ops[x->first_op + k];
			int64_t flat[VPS_MAX_DIMS];
			vps_rowmajor_strides(o->ext, o->ndim, flat);
			if (sending)
				vps_copy_strided(stage + o->staging, flat, bufs[o->src_buffer] + o->src_offset * o->esize,
						 o->src_strides, o->ext, o->ndim, o->esize);
			else
				vps_copy_strided(bufs[o->dst_buffer] + o->dst_offset * o->esize, o->dst_strides,
						 stage + o->staging, flat, o->ext, o->ndim, o->esize);
			*bytes += vps_op_bytes(o);
		}
	}
	return now() - t0;
}

/* memcpy of the same transfer sizes. */
static double plain(const struct vps_staged *s, int64_t rank, bool sending, unsigned char *from, unsigned char *to)
{
	double t0 = now();
	for (size_t i = 0; i < s->nxfers; i++) {
		const struct vps_xfer *x = &s->xfers[i];
		if (x->src == x->dst || (sending ? x->src : x->dst) != rank)
			continue;
		memcpy(to, from, (size_t)x->bytes);
	}
	return now() - t0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: pack_bench STAGED RANK [RUNS]\n");
		return 2;
	}
	struct vps_staged *s;
	if (vps_staged_load(&s, argv[1])) {
		fprintf(stderr, "pack_bench: %s\n", vps_last_error());
		return 2;
	}
	int64_t rank = atoll(argv[2]);
	int runs = argc > 3 ? atoi(argv[3]) : 7;
	const struct vps_plan *p = s->plan;
	struct vps_rank_view va = {0}, vb = {0};
	int64_t ra = vps_world_a_rank(p->world, rank), rb = vps_world_b_rank(p->world, rank);
	if ((ra >= 0 && vps_layout_rank(p->a, ra, &va)) || (rb >= 0 && vps_layout_rank(p->b, rb, &vb))) {
		fprintf(stderr, "pack_bench: %s\n", vps_last_error());
		return 2;
	}
	unsigned char **src = alloc_view(&va), **dst = alloc_view(&vb);
	int64_t biggest = 0;
	for (size_t i = 0; i < s->nxfers; i++)
		if (s->xfers[i].bytes > biggest)
			biggest = s->xfers[i].bytes;
	unsigned char *stage = malloc((size_t)biggest + 1), *other = malloc((size_t)biggest + 1);
	memset(stage, 2, (size_t)biggest);
	memset(other, 3, (size_t)biggest);
	double *tp = calloc((size_t)runs, sizeof(double)), *tu = calloc((size_t)runs, sizeof(double));
	double *mp = calloc((size_t)runs, sizeof(double)), *mu = calloc((size_t)runs, sizeof(double));
	int64_t bp = 0, bu = 0;
	for (int r = 0; r < runs; r++) {
		tp[r] = pass(s, rank, true, src, stage, &bp);
		mp[r] = plain(s, rank, true, other, stage);
		tu[r] = pass(s, rank, false, dst, stage, &bu);
		mu[r] = plain(s, rank, false, stage, other);
	}
	double p_gbs = (double)bp / median(tp, runs) / 1e9, mp_gbs = (double)bp / median(mp, runs) / 1e9;
	double u_gbs = (double)bu / median(tu, runs) / 1e9, mu_gbs = (double)bu / median(mu, runs) / 1e9;
	printf("pack:   %.1f MB, %.2f GB/s, memcpy %.2f GB/s, ratio %.2f\n", (double)bp / 1e6, p_gbs, mp_gbs,
	       p_gbs / mp_gbs);
	printf("unpack: %.1f MB, %.2f GB/s, memcpy %.2f GB/s, ratio %.2f\n", (double)bu / 1e6, u_gbs, mu_gbs,
	       u_gbs / mu_gbs);
	return 0;
}
