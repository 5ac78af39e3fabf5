/* The host's digest (vps_digest_region, what a rank with its state in host
 * memory computes under vps-exec --check) against the digest it replaced
 * (issue 42: two SplitMix64 finalizers an element, kept here as the
 * yardstick), side by side on the same bytes in one process.
 *
 *   digest_bench [MiB [RUNS]]      (defaults 64 and 9)
 *
 * For fp32 and bf16: a [rows, 4096] tensor of MiB MiB of random bits, one
 * contiguous region of all of it, and a TP shard of it (every row's middle
 * half, strided). Runs alternate the two functions, each timed by the
 * thread's CPU time; each figure is the median. One line a case: bytes,
 * GB/s and elements/s of each, and the new one's speed over the old one's
 * (at least 1 is the target). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/hash.h"
#include "vps/data.h"

/* the thread's CPU time: on a shared machine the time it was not
 * scheduled counts against neither function */
static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The digest before issue 42, element by element as vps_digest_region
 * walked it: vps_mix64(vps_mix64(key ^ index) ^ bits). */
static uint64_t old_digest(const void *buffer, const struct vps_region *r, const struct vps_tensor *t)
{
	uint64_t sum = 0, key = vps_mix64(((uint64_t)r->tensor << 8) ^ r->state);
	bool bf16 = vps_state_dtype(r->state) == VPS_DTYPE_BF16;
	int64_t rows = r->box.hi[0] - r->box.lo[0], len = r->box.hi[1] - r->box.lo[1];
	for (int64_t i = 0; i < rows; i++) {
		int64_t flat = (r->box.lo[0] + i) * t->shape[1] + r->box.lo[1], off = r->offset + i * r->strides[0];
		if (bf16) {
			const uint16_t *b = (const uint16_t *)buffer + off;
			for (int64_t j = 0; j < len; j++)
				sum += vps_mix64(vps_mix64(key ^ (uint64_t)(flat + j)) ^ b[j]);
		} else {
			const uint32_t *b = (const uint32_t *)buffer + off;
			for (int64_t j = 0; j < len; j++)
				sum += vps_mix64(vps_mix64(key ^ (uint64_t)(flat + j)) ^ b[j]);
		}
	}
	return sum;
}

static volatile uint64_t sink;

static void bench(const char *name, const void *buf, const struct vps_region *r, const struct vps_tensor *t, int runs)
{
	double *tn = calloc((size_t)runs, sizeof(double)), *to = calloc((size_t)runs, sizeof(double));
	if (!tn || !to) {
		fprintf(stderr, "digest_bench: out of memory\n");
		exit(1);
	}
	for (int k = -1; k < runs; k++) {
		double t0 = now();
		sink += vps_digest_region(buf, r, t);
		double t1 = now();
		sink += old_digest(buf, r, t);
		double t2 = now();
		if (k >= 0) {
			tn[k] = t1 - t0;
			to[k] = t2 - t1;
		}
	}
	qsort(tn, (size_t)runs, sizeof(double), cmp);
	qsort(to, (size_t)runs, sizeof(double), cmp);
	double n = (double)vps_box_volume(&r->box), bytes = n * (double)vps_dtype_size(vps_state_dtype(r->state));
	double a = tn[runs / 2], b = to[runs / 2];
	printf("%-24s %10.0f bytes  new %6.2f GB/s %6.3f Gelem/s  before %6.2f GB/s %6.3f Gelem/s  new/before %.2f\n",
	       name, bytes, bytes / a / 1e9, n / a / 1e9, bytes / b / 1e9, n / b / 1e9, b / a);
	free(tn);
	free(to);
}

int main(int argc, char **argv)
{
	long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 64, runs = argc > 2 ? strtol(argv[2], NULL, 10) : 9;
	if (mib < 1 || mib > 4096 || runs < 1 || runs > 999) {
		fprintf(stderr, "usage: digest_bench [MiB (1 to 4096) [RUNS (1 to 999)]]\n");
		return 2;
	}
	size_t bytes = (size_t)mib << 20;
	unsigned char *buf = malloc(bytes);
	if (!buf) {
		fprintf(stderr, "digest_bench: %zu bytes: out of memory\n", bytes);
		return 1;
	}
	uint64_t x = 0x9e3779b97f4a7c15ULL;
	for (size_t i = 0; i < bytes; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
	static const struct { const char *name; enum vps_state state; } cases[] = {
		{"fp32", VPS_STATE_EXP_AVG},
		{"bf16", VPS_STATE_PARAM},
	};
	for (size_t c = 0; c < 2; c++) {
		int64_t es = (int64_t)vps_dtype_size(vps_state_dtype(cases[c].state)), cols = 4096;
		int64_t rows = (int64_t)bytes / es / cols;
		struct vps_tensor t = {.ndim = 2, .shape = {rows, cols}};
		struct vps_region whole = {.tensor = 17, .state = (uint8_t)cases[c].state, .box = {2, {0, 0}, {rows, cols}},
					   .strides = {cols, 1}};
		struct vps_region shard = whole;
		shard.box.lo[1] = cols / 4;
		shard.box.hi[1] = 3 * cols / 4;
		shard.offset = cols / 4;
		char name[64];
		snprintf(name, sizeof(name), "%s, contiguous", cases[c].name);
		bench(name, buf, &whole, &t, (int)runs);
		snprintf(name, sizeof(name), "%s, half of each row", cases[c].name);
		bench(name, buf, &shard, &t, (int)runs);
	}
	free(buf);
	return 0;
}
