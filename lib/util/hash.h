/* A 64-bit hash of bytes: what names layouts, plans and staged plans, what
 * ranks compare before a switch, and what the fill pattern and the data
 * digest mix with. Not cryptographic (util/auth.h is); stable across builds
 * and hosts, so hashes written in files stay valid. */
#ifndef VPS_HASH_H
#define VPS_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The hash of len bytes from seed: a hash of several fields chains calls,
 * each result the next call's seed. */
uint64_t vps_hash64(const void *data, size_t len, uint64_t seed);
/* SplitMix64's finalizer: every bit of x reaches every bit of the result. */
static inline uint64_t vps_mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

#endif
