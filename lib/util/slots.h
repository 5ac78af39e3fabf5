/* An open-addressed index over an array its owner keeps: each slot holds
 * an entry's index + 1 (0: empty), found from the entry's 64-bit hash by
 * linear probing, the table at most half full so that every probe ends
 * at an empty slot. The entries never move for it. */
#ifndef VPS_SLOTS_H
#define VPS_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "vps/vps.h"

struct vps_slots {
	uint32_t *slot;
	size_t mask; /* slots - 1 (0: none yet) */
};

/* Room to add an entry to the n indexed (entries 0..n-1): doubles the
 * table where it would be over half full (the first one `first` slots, a
 * power of two), indexing the n again by hash_of(entries, i). VPS_EINPUT
 * past UINT32_MAX - 1 entries (`what` names them in the message). */
vps_result_t vps_slots_room(struct vps_slots *s, size_t n, size_t first,
			    uint64_t (*hash_of)(const void *entries, size_t i), const void *entries,
			    const char *what);

/* Where the probe for hash h starts, and the slot after `at`. */
static inline size_t vps_slots_start(const struct vps_slots *s, uint64_t h)
{
	return (size_t)h & s->mask;
}

static inline size_t vps_slots_next(const struct vps_slots *s, size_t at)
{
	return (at + 1) & s->mask;
}

void vps_slots_release(struct vps_slots *s);

#endif
