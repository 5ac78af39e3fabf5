/* Open-addressed indexes (util/slots.h). */
#include "util/slots.h"
#include "util/internal.h"

vps_result_t vps_slots_room(struct vps_slots *s, size_t n, size_t first,
			    uint64_t (*hash_of)(const void *entries, size_t i), const void *entries,
			    const char *what)
{
	if (s->mask && 2 * (n + 1) <= s->mask)
		return VPS_OK;
	if (n >= UINT32_MAX - 1)
		return vps_fail(VPS_EINPUT, "more than %u %s", UINT32_MAX - 2, what);
	size_t cap = s->mask ? (s->mask + 1) * 2 : first;
	while (2 * (n + 1) > cap - 1)
		cap *= 2;
	uint32_t *slot = vps_calloc(cap, sizeof(*slot));
	if (!slot)
		return VPS_NOMEM();
	for (size_t i = 0; i < n; i++) {
		size_t at = (size_t)hash_of(entries, i) & (cap - 1);
		while (slot[at])
			at = (at + 1) & (cap - 1);
		slot[at] = (uint32_t)i + 1;
	}
	free(s->slot);
	s->slot = slot;
	s->mask = cap - 1;
	return VPS_OK;
}

void vps_slots_release(struct vps_slots *s)
{
	free(s->slot);
	s->slot = NULL;
	s->mask = 0;
}
