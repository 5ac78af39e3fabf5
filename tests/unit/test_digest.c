/* The digest's function (vps_digest_region; docs/exec.md, The digest): its
 * parts add up to the whole wherever a tensor is cut, what it guarantees
 * for a change of one element, and how a change of several spreads over
 * the sum's 64 bits. The GPU kernel and the CUDA stand-in are held to it in
 * test_gpu. */
#include <stdlib.h>

#include "harness.h"
#include "util/internal.h"
#include "vps/data.h"

static uint64_t next(void) { return harness_random(); }

/* A 1-D tensor long enough for any index the tests take. */
static const struct vps_tensor line = {.ndim = 1, .shape = {(int64_t)1 << 40}};

/* The digest of elements [lo, hi) of a 1-D tensor, element i at b[i - lo]. */
static uint64_t run(uint32_t tensor, enum vps_state state, const void *b, int64_t lo, int64_t hi)
{
	struct vps_region r = {.tensor = tensor, .state = (uint8_t)state, .box = {1, {lo}, {hi}}, .strides = {1}};
	return vps_digest_region(b, &r, &line);
}

/* One element's term. */
static uint64_t term(uint32_t tensor, enum vps_state state, int64_t index, uint32_t bits)
{
	uint16_t h = (uint16_t)bits;
	return state == VPS_STATE_PARAM ? run(tensor, state, &h, index, index + 1) : run(tensor, state, &bits, index, index + 1);
}

/* n random elements of state's type */
static void *random_values(enum vps_state state, int64_t n)
{
	size_t es = vps_dtype_size(vps_state_dtype(state));
	unsigned char *b = malloc((size_t)n * es);
	for (int64_t i = 0; b && i < n * (int64_t)es; i++)
		b[i] = (unsigned char)next();
	return b;
}

static uint32_t bits_at(enum vps_state state, const void *b, int64_t i)
{
	return state == VPS_STATE_PARAM ? ((const uint16_t *)b)[i] : ((const uint32_t *)b)[i];
}

static void set_bits(enum vps_state state, void *b, int64_t i, uint32_t v)
{
	if (state == VPS_STATE_PARAM)
		((uint16_t *)b)[i] = (uint16_t)v;
	else
		((uint32_t *)b)[i] = v;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static const enum vps_state both[] = {VPS_STATE_PARAM, VPS_STATE_EXP_AVG}; /* bf16, fp32 */

TEST(the_digest_of_a_tensor_is_pinned)
{
	/* the function is part of the wire: executors of one version must
	 * agree with each other and with the GPU kernel, and a change of it
	 * is a new version (lib/exec/net/net_int.h's HELLO_MAGIC) */
	uint32_t f[5000];
	uint16_t h[5000];
	for (uint32_t i = 0; i < 5000; i++) {
		f[i] = i * 2654435761u;
		h[i] = (uint16_t)(i * 40503u);
	}
	CHECK(run(7, VPS_STATE_EXP_AVG, f, 0, 5000) == 0x7b01e7008eb22470ULL);
	CHECK(run(7, VPS_STATE_PARAM, h, 0, 5000) == 0x9ce6aaf437ad4a72ULL);
	CHECK(run(7, VPS_STATE_EXP_AVG, f, 1000, 6000) == 0xa6c8af06fc9a5cf6ULL);
}

TEST(parts_cut_anywhere_add_up_to_the_whole)
{
	enum { N = 3 * 2048 + 77 };
	for (size_t s = 0; s < 2; s++) {
		void *b = random_values(both[s], N);
		size_t es = vps_dtype_size(vps_state_dtype(both[s]));
		CHECK(b != NULL);
		if (!b)
			continue;
		uint64_t whole = run(3, both[s], b, 0, N);
		/* at the blocks' edges, beside them, and at random */
		int64_t cuts[] = {0, 1, 2047, 2048, 2049, 4096, 5000, 0, 0, 0, N};
		for (int k = 7; k < 10; k++)
			cuts[k] = (int64_t)(next() % N);
		for (int trial = 0; trial < 20; trial++) {
			int64_t a = cuts[next() % 11], c = cuts[next() % 11], lo = a < c ? a : c, hi = a < c ? c : a;
			uint64_t sum = run(3, both[s], b, 0, lo) + run(3, both[s], (unsigned char *)b + lo * (int64_t)es, lo, hi) +
				       run(3, both[s], (unsigned char *)b + hi * (int64_t)es, hi, N);
			CHECK(sum == whole);
		}
		/* a 2-D tensor: a box's digest depends on its elements' logical
		 * indices and values, not on where the buffer puts them */
		struct vps_tensor t = {.ndim = 2, .shape = {37, 300}};
		unsigned char *g = random_values(both[s], 37 * 300);
		struct vps_region all = {.tensor = 3, .state = (uint8_t)both[s], .box = {2, {0, 0}, {37, 300}}, .strides = {300, 1}};
		uint64_t w2 = g ? vps_digest_region(g, &all, &t) : 0, quarters = 0;
		unsigned char *padded = malloc((size_t)37 * 310 * es);
		CHECK(g && padded);
		for (int64_t i = 0; g && padded && i < 37; i++)
			memcpy(padded + (size_t)i * 310 * es, g + (size_t)i * 300 * es, 300 * es);
		for (int q = 0; g && padded && q < 4; q++) {
			struct vps_region r = all;
			r.box.lo[0] = q & 1 ? 20 : 0;
			r.box.hi[0] = q & 1 ? 37 : 20;
			r.box.lo[1] = q & 2 ? 123 : 0;
			r.box.hi[1] = q & 2 ? 300 : 123;
			r.strides[0] = 310;
			r.offset = r.box.lo[0] * 310 + r.box.lo[1];
			quarters += vps_digest_region(padded, &r, &t);
		}
		CHECK(quarters == w2);
		free(padded);
		free(g);
		free(b);
	}
}

TEST(a_change_of_one_element_always_changes_the_digest)
{
	/* for a fixed place the term is one-to-one in the element's bits:
	 * every bf16 value, and random fp32 ones */
	uint64_t *t = malloc(65536 * sizeof(*t));
	CHECK(t != NULL);
	for (int64_t index = 0; t && index < 5000; index += 2047) {
		for (uint32_t v = 0; v < 65536; v++)
			t[v] = term(11, VPS_STATE_PARAM, index, v);
		qsort(t, 65536, sizeof(*t), cmp_u64);
		int same = 0;
		for (uint32_t v = 1; v < 65536; v++)
			same += t[v] == t[v - 1] || !t[v - 1];
		CHECK_EQ(same, 0);
	}
	free(t);
	int same = 0;
	for (int i = 0; i < 100000; i++) {
		int64_t index = (int64_t)(next() >> 24);
		uint32_t a = (uint32_t)next(), b = (uint32_t)next();
		same += a != b && term(5, VPS_STATE_MAIN_PARAM, index, a) == term(5, VPS_STATE_MAIN_PARAM, index, b);
	}
	CHECK_EQ(same, 0);
}

TEST(dropped_added_duplicated_moved_and_swapped_elements_change_the_digest)
{
	enum { N = 3 * 2048 };
	for (size_t s = 0; s < 2; s++) {
		enum vps_state st = both[s];
		void *b = random_values(st, N), *y = random_values(st, N);
		CHECK(b && y);
		if (!b || !y)
			continue;
		uint64_t whole = run(9, st, b, 0, N), missed = 0;
		for (int k = 0; k < 2000; k++) {
			int64_t i = (int64_t)(next() % N), j = (int64_t)(next() % N);
			uint32_t vi = bits_at(st, b, i), vj = bits_at(st, b, j);
			/* dropped: the element left out of the sum */
			missed += whole - term(9, st, i, vi) == whole;
			/* added: one more element, 0 or any value */
			missed += whole + term(9, st, N + k, 0) == whole;
			missed += whole + term(9, st, N + k, vi) == whole;
			if (vi == vj)
				continue;
			/* duplicated: j holds i's value */
			set_bits(st, b, j, vi);
			missed += run(9, st, b, 0, N) == whole;
			/* swapped: i and j exchange theirs, as do neighbours and the
			 * same slot of the next block */
			set_bits(st, b, i, vj);
			missed += run(9, st, b, 0, N) == whole;
			set_bits(st, b, i, vi);
			set_bits(st, b, j, vj);
			int64_t n1 = i + 1 < N ? i + 1 : i - 1, n2 = (i + 2048) % N;
			missed += vi != bits_at(st, b, n1) && term(9, st, i, bits_at(st, b, n1)) + term(9, st, n1, vi) ==
								     term(9, st, i, vi) + term(9, st, n1, bits_at(st, b, n1));
			missed += vi != bits_at(st, b, n2) && term(9, st, i, bits_at(st, b, n2)) + term(9, st, n2, vi) ==
								     term(9, st, i, vi) + term(9, st, n2, bits_at(st, b, n2));
			/* moved to another tensor: i's value lands at tensor 10's i,
			 * and i keeps its old one or becomes 0 */
			uint32_t yi = bits_at(st, y, i);
			missed += yi != vi && term(10, st, i, vi) == term(10, st, i, yi);
			missed += vi && term(9, st, i, 0) + term(10, st, i, vi) == term(9, st, i, vi) + term(10, st, i, yi);
			/* the same element counted for the wrong (tensor, state) */
			missed += term(9, st, i, vi) == term(10, st, i, vi);
			missed += st != VPS_STATE_PARAM && term(9, st, i, vi) == term(9, VPS_STATE_EXP_AVG_SQ, i, vi);
		}
		CHECK_EQ(missed, 0);
		free(b);
		free(y);
	}
	/* the one value whose term is 0, so that an element of it added or
	 * dropped goes unseen: 0xffff0000, an fp32 NaN; no bf16 value */
	CHECK(term(9, VPS_STATE_EXP_AVG, 123, 0xffff0000u) == 0);
	CHECK(term(9, VPS_STATE_EXP_AVG, 123, 0) != 0);
}

/* Changes of several elements: the digest misses one when their terms'
 * differences sum to 0 mod 2^64. Modelled as random, that happens with
 * probability 2^-64; what a test can see is whether each byte of the
 * difference is spread evenly over its 256 values, for the changes a
 * wrong copy makes. A multiply alone, without the fold (y ^ (y >> 32)),
 * fails this: a sign flip's difference would be a multiple of 2^15 or
 * 2^31. */
enum { SAMPLES = 16384 };

static uint64_t change(int kind, enum vps_state st, uint64_t *rnd)
{
	uint32_t mask = st == VPS_STATE_PARAM ? 0xffffu : 0xffffffffu, sign = st == VPS_STATE_PARAM ? 0x8000u : 0x80000000u;
	uint32_t a = (uint32_t)rnd[0] & mask, b = (uint32_t)rnd[1] & mask, c = (uint32_t)rnd[2] & mask;
	uint32_t x = (uint32_t)(rnd[3] % 5000);
	int64_t i = (int64_t)(rnd[4] >> 30), j = (int64_t)(rnd[5] >> 30);
	switch (kind) {
	case 0: /* two elements swapped */
		return term(x, st, i, b) + term(x, st, j, a) - term(x, st, i, a) - term(x, st, j, b);
	case 1: /* neighbours swapped, a value and its negation */
		return term(x, st, i, a ^ sign) + term(x, st, i + 1, a) - term(x, st, i, a) - term(x, st, i + 1, a ^ sign);
	case 2: /* the same slot of two blocks swapped */
		return term(x, st, i, b) + term(x, st, i + 2048, a) - term(x, st, i, a) - term(x, st, i + 2048, b);
	case 3: /* two signs flipped */
		return term(x, st, i, a ^ sign) + term(x, st, j, b ^ sign) - term(x, st, i, a) - term(x, st, j, b);
	case 4: { /* a run of 8 one place on (i's value lost, i + 8 dropped) */
		uint64_t d = 0;
		uint32_t v[9];
		for (int k = 0; k < 9; k++)
			v[k] = (uint32_t)(rnd[k % 6] >> (k * 3)) & mask;
		for (int k = 0; k < 8; k++)
			d += term(x, st, i + k, v[k + 1]) - term(x, st, i + k, v[k]);
		return d;
	}
	case 5: /* one change made in two tensors at one place */
		return term(x, st, i, b) - term(x, st, i, a) + term(x + 1, st, i, b) - term(x + 1, st, i, a);
	case 6: /* an element moved to another tensor, its place left at 0 */
		return term(x, st, i, 0) - term(x, st, i, a) + term(x + 1, st, i, a) - term(x + 1, st, i, c);
	default: /* values off by one bit, its lowest, at two places */
		return term(x, st, i, a ^ 1) + term(x, st, j, b ^ 1) - term(x, st, i, a) - term(x, st, j, b);
	}
}

TEST(a_change_of_several_elements_spreads_over_all_64_bits)
{
	static const char *kinds[] = {"swap", "neighbours +x -x swapped", "same slot of two blocks swapped",
				      "two signs flipped", "a run shifted", "one change in two tensors",
				      "moved to another tensor", "two lowest bits flipped"};
	unsigned *count = calloc(8 * 256, sizeof(*count));
	CHECK(count != NULL);
	for (size_t s = 0; count && s < 2; s++) {
		for (int kind = 0; kind < 8; kind++) {
			memset(count, 0, 8 * 256 * sizeof(*count));
			int zero = 0;
			for (int n = 0; n < SAMPLES; n++) {
				uint64_t rnd[6];
				for (int k = 0; k < 6; k++)
					rnd[k] = next();
				if (kind == 0 || kind == 2 || kind == 5)
					rnd[1] = rnd[0] ^ (rnd[1] | 1); /* a and b differ */
				uint64_t d = change(kind, both[s], rnd);
				zero += !d;
				for (int byte = 0; byte < 8; byte++)
					count[byte * 256 + ((d >> (8 * byte)) & 255)]++;
			}
			CHECK_EQ(zero, 0);
			/* chi-square over each byte's 256 values (255 degrees of
			 * freedom: mean 255, deviation 22.6): 450 is past 8
			 * deviations */
			for (int byte = 0; byte < 8; byte++) {
				double chi = 0, want = SAMPLES / 256.0;
				for (int v = 0; v < 256; v++)
					chi += (count[byte * 256 + v] - want) * (count[byte * 256 + v] - want) / want;
				if (chi > 450)
					harness_fail(__FILE__, __LINE__, "%s, %s: byte %d of the difference: chi-square %.0f",
						     both[s] == VPS_STATE_PARAM ? "bf16" : "fp32", kinds[kind], byte, chi);
			}
		}
	}
	free(count);
}
