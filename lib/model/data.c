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

/* Walk a region row by row (the last axis): for each element, flat is its
 * row-major index in the logical tensor and off its buffer offset. */
#define FOR_EACH_ELEMENT(r, t, flat, off, ...)                                               \
	do {                                                                                 \
		int64_t idx_[VPS_MAX_DIMS], tstr_[VPS_MAX_DIMS], s_ = 1;                     \
		int nd_ = (r)->box.ndim, last_ = nd_ - 1;                                    \
		for (int k_ = (t)->ndim - 1; k_ >= 0; k_--) {                                \
			tstr_[k_] = s_;                                                      \
			s_ *= (t)->shape[k_];                                                \
		}                                                                            \
		for (int k_ = 0; k_ < nd_; k_++)                                             \
			idx_[k_] = (r)->box.lo[k_];                                          \
		int64_t rows_ = vps_box_volume(&(r)->box) / ((r)->box.hi[last_] - (r)->box.lo[last_]); \
		int64_t len_ = (r)->box.hi[last_] - (r)->box.lo[last_], ls_ = (r)->strides[last_];     \
		for (int64_t row_ = 0; row_ < rows_; row_++) {                               \
			int64_t flat0_ = 0, off0_ = (r)->offset;                             \
			for (int k_ = 0; k_ < nd_; k_++) {                                   \
				flat0_ += idx_[k_] * tstr_[k_];                              \
				off0_ += (idx_[k_] - (r)->box.lo[k_]) * (r)->strides[k_];    \
			}                                                                    \
			for (int64_t j_ = 0; j_ < len_; j_++) {                              \
				int64_t flat = flat0_ + j_, off = off0_ + j_ * ls_;          \
				__VA_ARGS__;                                                 \
			}                                                                    \
			for (int k_ = last_ - 1; k_ >= 0; k_--) {                            \
				if (++idx_[k_] < (r)->box.hi[k_])                            \
					break;                                               \
				idx_[k_] = (r)->box.lo[k_];                                  \
			}                                                                    \
		}                                                                            \
	} while (0)

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

uint64_t vps_digest_region(const void *buffer, const struct vps_region *r, const struct vps_tensor *t)
{
	uint64_t sum = 0, key = vps_mix64(((uint64_t)r->tensor << 8) ^ r->state);
	if (vps_dtype_size(vps_region_dtype(r)) == 2) {
		const uint16_t *b = buffer;
		FOR_EACH_ELEMENT(r, t, flat, off,
				 sum += vps_mix64(vps_mix64(key ^ (uint64_t)flat) ^ b[off]));
	} else {
		const uint32_t *b = buffer;
		FOR_EACH_ELEMENT(r, t, flat, off,
				 sum += vps_mix64(vps_mix64(key ^ (uint64_t)flat) ^ b[off]));
	}
	return sum;
}
