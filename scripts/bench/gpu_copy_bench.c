/* The copy kernel against cudaMemcpy device-to-device, on the same bytes,
 * side by side in one process: a contiguous copy, a gather of a TP shard
 * (rows of one part of each row of a [rows, cols] bf16 tensor into a
 * staging buffer), the matching scatter, and short rows. Each figure is the
 * median of RUNS timed runs after a warm-up, timed with CUDA events.
 *
 *   gpu_copy_bench [MiB]      (default 1024)
 *
 * Prints one line per case: bytes, seconds, GB/s (bytes copied, counted
 * once), and the ratio to cudaMemcpy of the same bytes. Exits 2 without a
 * GPU. */
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu.h"
#include "util/internal.h"
#include "exec/transport/transport.h"

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

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1024;
	if (!mib || mib > (1u << 20)) {
		fprintf(stderr, "gpu_copy_bench: MiB must be 1 to 1048576\n");
		return 2;
	}
	if (vps_gpu_init(-1, 0, &api)) {
		fprintf(stderr, "gpu_copy_bench: %s\n", vps_last_error());
		return 2;
	}
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
	api->release(a, err);
	api->release(b, err);
	return 0;
}
