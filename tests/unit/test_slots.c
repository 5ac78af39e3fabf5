/* Open-addressed indexes (lib/util/slots.h): what the planner's memo, the
 * floor's replica sets and the statistics' classes find their entries by. */
#include <stdlib.h>

#include "harness.h"
#include "util/slots.h"

struct entry {
	uint64_t h;
	int64_t value;
};

static uint64_t entry_hash(const void *entries, size_t i)
{
	return ((const struct entry *)entries)[i].h;
}

/* Where value v is among the n entries, by its hash h (-1: not there). */
static int64_t find(const struct vps_slots *s, const struct entry *e, uint64_t h, int64_t v)
{
	for (size_t at = vps_slots_start(s, h); s->slot[at]; at = vps_slots_next(s, at))
		if (e[s->slot[at] - 1].value == v)
			return (int64_t)s->slot[at] - 1;
	return -1;
}

/* Entries whose hashes collide in runs (many share one) are all found
 * again after the table has doubled many times over, the table is never
 * over half full, and a value never added is not found. */
TEST(every_entry_is_found_as_the_table_grows)
{
	enum { N = 20000 };
	struct entry *e = calloc(N, sizeof(*e));
	struct vps_slots s = {0};
	if (!e) {
		harness_fail(__FILE__, __LINE__, "out of memory");
		return;
	}
	for (size_t i = 0; i < N; i++) {
		uint64_t h = i % 3 ? (uint64_t)i * 0x9e3779b97f4a7c15u : 42;
		CHECK_OK(vps_slots_room(&s, i, 8, entry_hash, e, "entries"));
		CHECK(2 * (i + 1) <= s.mask);
		size_t at = vps_slots_start(&s, h);
		while (s.slot[at])
			at = vps_slots_next(&s, at);
		e[i] = (struct entry){h, (int64_t)i};
		s.slot[at] = (uint32_t)i + 1;
	}
	size_t lost = 0;
	for (size_t i = 0; i < N; i++)
		lost += find(&s, e, e[i].h, (int64_t)i) != (int64_t)i;
	CHECK(lost == 0);
	CHECK(find(&s, e, 42, N) == -1);
	CHECK(s.mask + 1 <= 4 * (size_t)N);
	vps_slots_release(&s);
	CHECK(s.slot == NULL && s.mask == 0);
	free(e);
}
