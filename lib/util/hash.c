/* The 64-bit hash (util/hash.h). */
#include "util/hash.h"
#include "util/internal.h"

uint64_t vps_hash64(const void *data, size_t len, uint64_t seed)
{
	const unsigned char *p = data;
	uint64_t h = vps_mix64(seed ^ (len * 0x9e3779b97f4a7c15ULL));
	while (len >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = vps_mix64(h ^ w) + 0x9e3779b97f4a7c15ULL;
		p += 8;
		len -= 8;
	}
	uint64_t w = 0;
	memcpy(&w, p, len);
	return vps_mix64(h ^ w ^ ((uint64_t)len << 56));
}
