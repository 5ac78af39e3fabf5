/* The copy kernel against cudaMemcpy device-to-device, on the same bytes,
 * side by side in one process: a contiguous copy, a gather of a TP shard
 * (rows of one part of each row of a [rows, cols] bf16 tensor into a
 * staging buffer), the matching scatter, and short rows; and the digest
 * kernel (vps-exec --check on GPU memory) reading the same bytes, and
 * its time over its floor (reading those bytes at the memory traffic
 * cudaMemcpy reaches). Each figure is the median of RUNS timed runs after a
 * warm-up, timed with CUDA events.
 *
 *   gpu_copy_bench [MiB]                 (default 1024)
 *   gpu_copy_bench --replay STAGED [MiB]
 *
 * Prints one line per case: bytes, seconds, GB/s (bytes copied, counted
 * once), and the ratio to cudaMemcpy of the same bytes.
 *
 * --replay: every rank's copies of a staged switch over ipc (its pulls from
 * its peers' sources and its retains, stage by stage, each stage one
 * kernel), one rank at a time with the GPU to itself: what a rank's kernel
 * does on a GPU of its own, which eight processes sharing one GPU cannot
 * show (their kernels are time-sliced). Every rank's buffers live in this
 * process; a line per rank, then the slowest. Exits 2 without a GPU. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu.h"
#include "io/doc.h"
#include "util/hash.h"
#include "util/internal.h"
#include "exec/transport/transport.h"
#include "vps/data.h"

enum { RUNS = 9 };

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static const struct vps_cuda_api *api;
static char err[VPS_CUDA_ERR];

static double time_memcpy(void *dst, const void *src, size_t bytes)
{
	double t[RUNS];
	for (int r = -1; r < RUNS; r++) {
		void *a, *b;
		api->mark(&a, err);
		api->memcpy_d2d(dst, src, bytes, err);
		api->mark(&b, err);
		double s = 0;
		api->elapsed(a, b, &s, err);
		api->mark_free(a);
		api->mark_free(b);
		if (r >= 0)
			t[r] = s;
	}
	qsort(t, RUNS, sizeof(*t), cmp);
	return t[RUNS / 2];
}

static double time_kernel(const struct vps_cuda_copy *c, size_t n)
{
	double t[RUNS];
	for (int r = -1; r < RUNS; r++) {
		void *a, *b;
		api->mark(&a, err);
		if (api->copy(c, n, err)) {
			fprintf(stderr, "gpu_copy_bench: %s\n", err);
			exit(1);
		}
		api->mark(&b, err);
		double s = 0;
		api->elapsed(a, b, &s, err);
		api->sync(NULL, -1, err);
		api->mark_free(a);
		api->mark_free(b);
		if (r >= 0)
			t[r] = s;
	}
	qsort(t, RUNS, sizeof(*t), cmp);
	return t[RUNS / 2];
}

static void report(const char *name, size_t bytes, double kernel, double memcpy_s)
{
	printf("%-34s %12zu bytes  %.6f s  %7.1f GB/s  %.3fx cudaMemcpy (%.1f GB/s)\n", name, bytes, kernel,
	       (double)bytes / kernel / 1e9, memcpy_s / kernel, (double)bytes / memcpy_s / 1e9);
}

/* A [rows, cols] bf16 tensor's column block [c0, c0 + w) as a 2-D view. */
static struct vps_cuda_copy shard(void *tensor, void *staging, int64_t rows, int64_t cols, int64_t c0, int64_t w,
				  bool gather)
{
	struct vps_cuda_copy c = {0};
	c.ndim = 2;
	c.esize = 2;
	c.ext[0] = rows;
	c.ext[1] = w;
	int64_t strided[2] = {cols, 1}, flat[2] = {w, 1};
	uint64_t t = (uint64_t)(uintptr_t)tensor + (uint64_t)c0 * 2, s = (uint64_t)(uintptr_t)staging;
	c.src = gather ? t : s;
	c.dst = gather ? s : t;
	for (int k = 0; k < 2; k++) {
		c.src_strides[k] = gather ? strided[k] : flat[k];
		c.dst_strides[k] = gather ? flat[k] : strided[k];
	}
	return c;
}

static double time_digest(const struct vps_cuda_digest *v, size_t n)
{
	double t[RUNS];
	for (int r = -1; r < RUNS; r++) {
		void *a, *b;
		uint64_t sum = 0;
		api->mark(&a, err);
		if (api->digest(v, n, &sum, err)) {
			fprintf(stderr, "gpu_copy_bench: %s\n", err);
			exit(1);
		}
		api->mark(&b, err);
		double sec = 0;
		api->elapsed(a, b, &sec, err);
		api->mark_free(a);
		api->mark_free(b);
		if (r >= 0)
			t[r] = sec;
	}
	qsort(t, RUNS, sizeof(*t), cmp);
	return t[RUNS / 2];
}

/* A digest's line: report()'s, then its time over its floor, the least any
 * digest of those bytes can take: reading them at the memory traffic
 * cudaMemcpy reaches (a read and a write a byte copied). */
static void report_digest(const char *name, size_t bytes, double kernel, double memcpy_s, size_t memcpy_bytes)
{
	double floor_s = (double)bytes / (2.0 * (double)memcpy_bytes / memcpy_s);
	printf("%-34s %12zu bytes  %.6f s  %7.1f GB/s  %.3fx cudaMemcpy (%.1f GB/s); %.2fx its floor (reading at %.0f GB/s)\n",
	       name, bytes, kernel, (double)bytes / kernel / 1e9, memcpy_s * (double)bytes / (double)memcpy_bytes / kernel,
	       (double)memcpy_bytes / memcpy_s / 1e9, kernel / floor_s, 2.0 * (double)memcpy_bytes / memcpy_s / 1e9);
}

/* A contiguous 1-D view of n elements of esize bytes at addr, the first of
 * logical index flat. */
static struct vps_cuda_digest digest_view(void *addr, int esize, int64_t n, int64_t flat, uint64_t key)
{
	struct vps_cuda_digest v = {0};
	v.addr = (uint64_t)(uintptr_t)addr;
	v.key = key;
	v.flat = flat;
	v.ndim = 1;
	v.esize = esize;
	v.ext[0] = n;
	v.strides[0] = v.flat_strides[0] = 1;
	return v;
}

/* ---- --replay: each rank's copies of a staged switch, alone ---- */

struct side {
	void *base;
	void **buf; /* by buffer of the rank's view */
};

/* One allocation for a rank view's buffers, each at a 256-byte offset. */
static void alloc_side(const struct vps_layout *l, int64_t rank, struct side *s)
{
	struct vps_rank_view v;
	memset(s, 0, sizeof(*s));
	if (rank < 0)
		return;
	if (vps_layout_rank(l, rank, &v)) {
		fprintf(stderr, "gpu_copy_bench: %s\n", vps_last_error());
		exit(1);
	}
	size_t total = 256;
	for (size_t b = 0; b < v.nbuffers; b++)
		total += ((size_t)v.buffers[b].elements * vps_dtype_size(v.buffers[b].dtype) + 255) / 256 * 256;
	s->buf = calloc(v.nbuffers + 1, sizeof(*s->buf));
	if (!s->buf || api->alloc(&s->base, total, err) || api->fill(s->base, 0, total, err)) {
		fprintf(stderr, "gpu_copy_bench: rank %" PRId64 ": %zu bytes: %s\n", rank, total, err);
		exit(1);
	}
	size_t at = 256;
	for (size_t b = 0; b < v.nbuffers; b++) {
		s->buf[b] = (unsigned char *)s->base + at;
		at += ((size_t)v.buffers[b].elements * vps_dtype_size(v.buffers[b].dtype) + 255) / 256 * 256;
	}
	vps_rank_view_release(&v);
}

static struct vps_cuda_copy op_copy(const struct vps_op *op, void *src, void *dst)
{
	struct vps_cuda_copy k = {0};
	k.src = (uint64_t)(uintptr_t)src + (uint64_t)op->src_offset * op->esize;
	k.dst = (uint64_t)(uintptr_t)dst + (uint64_t)op->dst_offset * op->esize;
	k.ndim = op->ndim;
	k.esize = op->esize;
	for (int d = 0; d < op->ndim; d++) {
		k.ext[d] = op->ext[d];
		k.src_strides[d] = op->src_strides[d];
		k.dst_strides[d] = op->dst_strides[d];
	}
	return k;
}

static int replay(const char *path, size_t mib)
{
	struct vps_staged *s;
	if (vps_staged_load(&s, path)) {
		fprintf(stderr, "gpu_copy_bench: %s: %s\n", path, vps_last_error());
		return 2;
	}
	const struct vps_plan *p = s->plan;
	int64_t W = vps_world_size(p->world);
	struct side *src = calloc((size_t)W, sizeof(*src)), *dst = calloc((size_t)W, sizeof(*dst));
	struct vps_cuda_copy *k = calloc(s->nops + 1, sizeof(*k));
	if (!src || !dst || !k)
		return 1;
	for (int64_t w = 0; w < W; w++) {
		alloc_side(p->a, vps_world_a_rank(p->world, w), &src[w]);
		alloc_side(p->b, vps_world_b_rank(p->world, w), &dst[w]);
	}
	/* the yardstick: cudaMemcpy of mib MiB in one buffer pair */
	size_t bytes = mib << 20;
	void *ya = NULL, *yb = NULL;
	if (api->alloc(&ya, bytes, err) || api->alloc(&yb, bytes, err) || api->fill(ya, 1, bytes, err)) {
		fprintf(stderr, "gpu_copy_bench: %s\n", err);
		return 1;
	}
	double mc = (double)bytes / time_memcpy(yb, ya, bytes) / 1e9;
	double slowest = 0, total_bytes = 0, total_sec = 0;
	int64_t slow = -1;
	printf("replay %s: %" PRId64 " ranks, %zu stages; each rank alone on the GPU, cudaMemcpy %.1f GB/s\n", path, W,
	       s->nstages, mc);
	for (int64_t w = 0; w < W; w++) {
		double sec = 0;
		int64_t moved = 0;
		size_t i = 0;
		for (size_t st = 0; st < s->nstages; st++) {
			size_t n = 0;
			for (; i < s->nxfers && s->xfers[i].stage == (int64_t)st; i++) {
				const struct vps_xfer *x = &s->xfers[i];
				if (x->dst != w)
					continue;
				for (size_t q = 0; q < x->nops; q++) {
					const struct vps_op *op = &s->ops[x->first_op + q];
					k[n++] = op_copy(op, src[x->src].buf[op->src_buffer], dst[w].buf[op->dst_buffer]);
					moved += vps_op_bytes(op);
				}
			}
			if (!n)
				continue;
			void *a, *b;
			double t = 0;
			api->mark(&a, err);
			if (api->copy(k, n, err) || api->mark(&b, err) || api->elapsed(a, b, &t, err) ||
			    api->sync(NULL, 60, err)) {
				fprintf(stderr, "gpu_copy_bench: rank %" PRId64 ", stage %zu: %s\n", w, st, err);
				return 1;
			}
			api->mark_free(a);
			api->mark_free(b);
			sec += t;
		}
		double rate = sec > 0 ? (double)moved / sec / 1e9 : 0;
		printf("rank %" PRId64 ": %" PRId64 " bytes  %.6f s  %7.1f GB/s  %.3fx cudaMemcpy\n", w, moved, sec, rate,
		       rate / mc);
		total_bytes += (double)moved;
		total_sec += sec;
		if (sec > slowest) {
			slowest = sec;
			slow = w;
		}
	}
	printf("slowest rank alone: %" PRId64 ", %.6f s; every rank in turn: %.3f GB in %.6f s of kernels = %.1f GB/s\n",
	       slow, slowest, total_bytes / 1e9, total_sec, total_sec > 0 ? total_bytes / total_sec / 1e9 : 0);
	for (int64_t w = 0; w < W; w++) {
		if (src[w].base)
			api->release(src[w].base, err);
		if (dst[w].base)
			api->release(dst[w].base, err);
		free(src[w].buf);
		free(dst[w].buf);
	}
	api->release(ya, err);
	api->release(yb, err);
	free(src);
	free(dst);
	free(k);
	vps_staged_free(s);
	return 0;
}

int main(int argc, char **argv)
{
	const char *staged = NULL;
	if (argc > 2 && !strcmp(argv[1], "--replay")) {
		staged = argv[2];
		argv += 2;
		argc -= 2;
	}
	size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1024;
	if (!mib || mib > (1u << 20)) {
		fprintf(stderr, "gpu_copy_bench: MiB must be 1 to 1048576\n");
		return 2;
	}
	if (vps_gpu_init(-1, 0, &api)) {
		fprintf(stderr, "gpu_copy_bench: %s\n", vps_last_error());
		return 2;
	}
	if (staged)
		return replay(staged, mib);
	size_t bytes = mib << 20;
	void *a = NULL, *b = NULL;
	if (api->alloc(&a, bytes, err) || api->alloc(&b, bytes, err) || api->fill(a, 1, bytes, err) ||
	    api->fill(b, 2, bytes, err)) {
		fprintf(stderr, "gpu_copy_bench: %s\n", err);
		return 1;
	}
	double mc = time_memcpy(b, a, bytes);
	struct vps_cuda_copy flat = {0};
	flat.src = (uint64_t)(uintptr_t)a;
	flat.dst = (uint64_t)(uintptr_t)b;
	flat.ndim = 1;
	flat.esize = 2;
	flat.ext[0] = (int64_t)(bytes / 2);
	flat.src_strides[0] = flat.dst_strides[0] = 1;
	report("contiguous", bytes, time_kernel(&flat, 1), mc);
	/* TP shards: half of each row of an 8192-wide (4 KiB rows) and a
	 * 1024-wide (512-byte rows) bf16 tensor that fills the buffer */
	static const struct { const char *name; int64_t cols, width; bool gather; } cases[] = {
		{"gather: 8 KiB rows of 16 KiB", 8192, 4096, true},
		{"scatter: 8 KiB rows of 16 KiB", 8192, 4096, false},
		{"gather: 1 KiB rows of 2 KiB", 1024, 512, true},
		{"scatter: 1 KiB rows of 2 KiB", 1024, 512, false},
		{"gather: 256 B rows of 8 KiB", 4096, 128, true},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		int64_t rows = (int64_t)(bytes / 2) / cases[i].cols;
		struct vps_cuda_copy c = shard(a, b, rows, cases[i].cols, cases[i].width / 2, cases[i].width, cases[i].gather);
		if (!cases[i].gather)
			c = shard(b, a, rows, cases[i].cols, cases[i].width / 2, cases[i].width, false);
		size_t moved = (size_t)(rows * cases[i].width * 2);
		double m = time_memcpy(b, a, moved);
		report(cases[i].name, moved, time_kernel(&c, 1), m);
	}
	/* the digest reads every element once: fp32 states, then bf16
	 * parameters, each one contiguous view of the whole buffer; a state
	 * as a mixed-precision Adam keeps it (a bf16 parameter, an fp32 main
	 * parameter and two moments: 14 bytes, what the switches' state is
	 * made of), four views in one launch; and bf16 whose logical index is
	 * off its 16-byte vectors (read element by element) */
	for (int es = 4; es >= 2; es -= 2) {
		struct vps_cuda_digest v = digest_view(a, es, (int64_t)(bytes / (size_t)es), 0, vps_mix64(7));
		report_digest(es == 4 ? "digest: fp32" : "digest: bf16", bytes, time_digest(&v, 1), mc, bytes);
	}
	int64_t e = (int64_t)(bytes / 14) / 128 * 128; /* each view 256-byte aligned, as allocators place them */
	struct vps_cuda_digest mix[4];
	unsigned char *at = a;
	for (int k = 0; k < 4; k++) {
		int es = k ? 4 : 2;
		mix[k] = digest_view(at, es, e, 0, vps_mix64((uint64_t)k));
		at += (size_t)e * (size_t)es;
	}
	report_digest("digest: state, 1 bf16 to 3 fp32", (size_t)e * 14, time_digest(mix, 4), mc, bytes);
	struct vps_cuda_digest off = digest_view(a, 2, (int64_t)(bytes / 2) - 8, 1, vps_mix64(7));
	report_digest("digest: bf16, index off its vectors", bytes - 16, time_digest(&off, 1), mc, bytes);
	api->release(a, err);
	api->release(b, err);
	return 0;
}
