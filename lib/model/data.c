#include <pthread.h>

#include "util/hash.h"
#include "util/internal.h"
#include "vps/data.h"

static inline uint64_t fill_key(uint32_t tensor, int state, int64_t step)
{
	return vps_mix64(((uint64_t)tensor << 40) ^ ((uint64_t)state << 32) ^ (uint64_t)step * 0x9e3779b97f4a7c15ULL);
}

/* One multiply-xorshift round: cheap enough to fill and check gigabytes,
 * and every bit of the index reaches the result. */
static inline uint32_t fill_at(uint64_t key, int64_t index)
{
	uint64_t x = key ^ ((uint64_t)index * 0x9e3779b97f4a7c15ULL);
	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ULL;
	return (uint32_t)(x >> 32);
}

uint32_t vps_fill_bits(uint32_t tensor, enum vps_state state, int64_t index, int64_t step)
{
	return fill_at(fill_key(tensor, state, step), index);
}

/* Walk a region row by row (the last axis): each row is len elements from
 * logical index flat0 (row-major in the tensor) and buffer offset off0, a
 * step of ls in the buffer for each. */
#define FOR_EACH_ROW(r, t, flat0, off0, len, ls, ...)                                        \
	do {                                                                                 \
		int64_t idx_[VPS_MAX_DIMS], tstr_[VPS_MAX_DIMS], s_ = 1;                     \
		int nd_ = (r)->box.ndim, last_ = nd_ - 1;                                    \
		for (int k_ = (t)->ndim - 1; k_ >= 0; k_--) {                                \
			tstr_[k_] = s_;                                                      \
			s_ *= (t)->shape[k_];                                                \
		}                                                                            \
		for (int k_ = 0; k_ < nd_; k_++)                                             \
			idx_[k_] = (r)->box.lo[k_];                                          \
		int64_t len = (r)->box.hi[last_] - (r)->box.lo[last_], ls = (r)->strides[last_];       \
		int64_t rows_ = len > 0 ? vps_box_volume(&(r)->box) / len : 0; /* empty: none */        \
		for (int64_t row_ = 0; row_ < rows_; row_++) {                               \
			int64_t flat0 = 0, off0 = (r)->offset;                               \
			for (int k_ = 0; k_ < nd_; k_++) {                                   \
				flat0 += idx_[k_] * tstr_[k_];                               \
				off0 += (idx_[k_] - (r)->box.lo[k_]) * (r)->strides[k_];     \
			}                                                                    \
			__VA_ARGS__;                                                         \
			for (int k_ = last_ - 1; k_ >= 0; k_--) {                            \
				if (++idx_[k_] < (r)->box.hi[k_])                            \
					break;                                               \
				idx_[k_] = (r)->box.lo[k_];                                  \
			}                                                                    \
		}                                                                            \
	} while (0)

/* ... and element by element: flat is its logical index, off its offset. */
#define FOR_EACH_ELEMENT(r, t, flat, off, ...)                                               \
	FOR_EACH_ROW(r, t, flat0_, off0_, len_, ls_, for (int64_t j_ = 0; j_ < len_; j_++) {      \
		int64_t flat = flat0_ + j_, off = off0_ + j_ * ls_;                          \
		__VA_ARGS__;                                                                 \
	})

void vps_fill_region(void *buffer, const struct vps_region *r, const struct vps_tensor *t, int64_t step)
{
	uint64_t key = fill_key(r->tensor, r->state, step);
	if (vps_dtype_size(vps_region_dtype(r)) == 2) {
		uint16_t *b = buffer;
		FOR_EACH_ELEMENT(r, t, flat, off, b[off] = (uint16_t)fill_at(key, flat));
	} else {
		uint32_t *b = buffer;
		FOR_EACH_ELEMENT(r, t, flat, off, b[off] = fill_at(key, flat));
	}
}

int64_t vps_check_region(const void *buffer, const struct vps_region *r, const struct vps_tensor *t, int64_t step)
{
	uint64_t key = fill_key(r->tensor, r->state, step);
	int64_t bad = 0;
	if (vps_dtype_size(vps_region_dtype(r)) == 2) {
		const uint16_t *b = buffer;
		FOR_EACH_ELEMENT(r, t, flat, off, bad += b[off] != (uint16_t)fill_at(key, flat));
	} else {
		const uint32_t *b = buffer;
		FOR_EACH_ELEMENT(r, t, flat, off, bad += b[off] != fill_at(key, flat));
	}
	return bad;
}

/* The digest (docs/exec.md, The digest). An element's term is one 64-bit
 * multiply by a key of its place, folded once: cheap enough for a GPU to
 * digest at the speed it reads memory, and, for a fixed place, a bijection
 * of the element's bits. The key of element i of (tensor, state) is the
 * key of its block of VPS_DIGEST_BLOCK (one SplitMix64 finalizer of the
 * tensor's key and the block) xor the key of its slot in the block (one
 * table for every tensor), made odd. lib/gpu/cuda/vps_digest.h computes
 * the same for the kernel and the CUDA stand-in; the tests hold it to this. */
#define DIGEST_BLOCK_BITS 11
#define DIGEST_BLOCK (1 << DIGEST_BLOCK_BITS)

static uint64_t digest_slot[DIGEST_BLOCK];
static pthread_once_t digest_slot_once = PTHREAD_ONCE_INIT;

static void digest_slot_fill(void)
{
	for (uint64_t l = 0; l < DIGEST_BLOCK; l++)
		digest_slot[l] = vps_mix64((l + 1) * 0xd1b54a32d192ed03ULL);
}

static inline uint64_t digest_block_key(uint64_t key, int64_t block)
{
	return vps_mix64(key ^ ((uint64_t)block + 1) * 0x9e3779b97f4a7c15ULL);
}

/* w -> w * k is one-to-one for an odd k, and so is y -> y ^ (y >> 32);
 * w is never 0 for a 16-bit value, so a bf16 element always adds a term */
static inline uint64_t digest_term(uint64_t k, uint32_t bits)
{
	uint64_t y = (uint64_t)(bits ^ 0xffff0000u) * k;
	return y ^ (y >> 32);
}

/* The terms of a row: n elements of esize bytes, a step of ls from p,
 * from logical index flat; a block at a time, one block key each. */
static uint64_t digest_row(uint64_t key, const unsigned char *p, int64_t ls, size_t esize, int64_t flat, int64_t n)
{
	uint64_t sum = 0;
	for (int64_t done = 0; done < n;) {
		int64_t in = (flat + done) & (DIGEST_BLOCK - 1), m = DIGEST_BLOCK - in < n - done ? DIGEST_BLOCK - in : n - done;
		uint64_t bkey = digest_block_key(key, (flat + done) >> DIGEST_BLOCK_BITS);
		const uint64_t *slot = digest_slot + in;
		if (esize == 2) {
			const uint16_t *b = (const uint16_t *)p + done * ls;
			for (int64_t j = 0; j < m; j++)
				sum += digest_term((bkey ^ slot[j]) | 1, b[j * ls]);
		} else {
			const uint32_t *b = (const uint32_t *)p + done * ls;
			for (int64_t j = 0; j < m; j++)
				sum += digest_term((bkey ^ slot[j]) | 1, b[j * ls]);
		}
		done += m;
	}
	return sum;
}

uint64_t vps_digest_region(const void *buffer, const struct vps_region *r, const struct vps_tensor *t)
{
	pthread_once(&digest_slot_once, digest_slot_fill);
	uint64_t sum = 0, key = vps_mix64(((uint64_t)r->tensor << 8) ^ r->state);
	size_t es = vps_dtype_size(vps_region_dtype(r));
	FOR_EACH_ROW(r, t, flat0, off0, len, ls,
		     sum += digest_row(key, (const unsigned char *)buffer + off0 * (int64_t)es, ls, es, flat0, len));
	return sum;
}
