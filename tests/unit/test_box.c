/* Box algebra: flat-range decomposition and subtraction, checked
 * exhaustively on small shapes. */
#include <string.h>

#include "harness.h"
#include "vps/box.h"

static int64_t flat_index(const int64_t *ext, int ndim, const int64_t *idx)
{
	int64_t f = 0;
	for (int k = 0; k < ndim; k++)
		f = f * ext[k] + idx[k];
	return f;
}

TEST(flat_range_boxes_tile_the_range_in_order)
{
	const int64_t ext[3] = {3, 4, 5};
	int64_t vol = 60;
	for (int64_t lo = 0; lo <= vol; lo++)
		for (int64_t hi = lo; hi <= vol; hi++) {
			struct vps_box b[8];
			int64_t starts[8];
			int n = vps_flat_range_boxes(3, ext, lo, hi, b, starts);
			CHECK(n <= 5);
			int64_t next = lo;
			for (int i = 0; i < n; i++) {
				CHECK_EQ(starts[i], next);
				/* contiguous: its first and last element bound its volume */
				int64_t last[3];
				for (int k = 0; k < 3; k++)
					last[k] = b[i].hi[k] - 1;
				CHECK_EQ(flat_index(ext, 3, b[i].lo), starts[i]);
				CHECK_EQ(flat_index(ext, 3, last) + 1 - starts[i], vps_box_volume(&b[i]));
				next += vps_box_volume(&b[i]);
			}
			CHECK_EQ(next, hi);
		}
}

TEST(subtract_leaves_exactly_the_difference)
{
	struct vps_box a = {2, {0, 0}, {6, 6}};
	for (int64_t x0 = -1; x0 < 7; x0++)
		for (int64_t x1 = x0 + 1; x1 < 8; x1++)
			for (int64_t y0 = 2; y0 < 4; y0++) {
				struct vps_box b = {2, {x0, y0}, {x1, y0 + 3}}, out[4];
				int n = vps_box_subtract(&a, &b, out);
				for (int64_t i = 0; i < 6; i++)
					for (int64_t j = 0; j < 6; j++) {
						int64_t idx[2] = {i, j};
						bool in_b = i >= b.lo[0] && i < b.hi[0] && j >= b.lo[1] && j < b.hi[1];
						int hits = 0;
						for (int k = 0; k < n; k++)
							hits += i >= out[k].lo[0] && i < out[k].hi[0] && j >= out[k].lo[1] &&
								j < out[k].hi[1];
						(void)idx;
						CHECK_EQ(hits, in_b ? 0 : 1);
					}
			}
}

TEST(gaps_of_a_union)
{
	struct vps_box t = {2, {0, 0}, {10, 10}};
	struct vps_box parts[3] = {{2, {0, 0}, {5, 10}}, {2, {5, 0}, {10, 4}}, {2, {5, 6}, {10, 10}}};
	struct vps_box gaps[4];
	size_t n = vps_boxes_gaps(parts, 3, &t, gaps, 4);
	CHECK_EQ(n, 1);
	CHECK_EQ(gaps[0].lo[0], 5);
	CHECK_EQ(gaps[0].hi[0], 10);
	CHECK_EQ(gaps[0].lo[1], 4);
	CHECK_EQ(gaps[0].hi[1], 6);
	parts[1].hi[1] = 6;
	CHECK_EQ(vps_boxes_gaps(parts, 3, &t, gaps, 4), 0);
}

/* Cut a 10x10 box by three boxes in turn: what is left is exactly the cells
 * none of them covers, each cell once. */
TEST(a_box_list_after_cuts)
{
	struct vps_box whole = {2, {0, 0}, {10, 10}};
	struct vps_box cuts[3] = {{2, {0, 0}, {5, 10}}, {2, {5, 0}, {10, 4}}, {2, {7, 7}, {20, 20}}};
	struct vps_boxes rem = {0}, scratch = {0};
	CHECK_OK(vps_boxes_reset(&rem, &whole));
	for (int c = 0; c < 3; c++)
		CHECK_OK(vps_boxes_subtract(&rem, &scratch, &cuts[c]));
	int64_t left = 0;
	for (int64_t i = 0; i < 10; i++)
		for (int64_t j = 0; j < 10; j++) {
			int covered = 0, hits = 0;
			for (int c = 0; c < 3; c++)
				covered |= i >= cuts[c].lo[0] && i < cuts[c].hi[0] && j >= cuts[c].lo[1] && j < cuts[c].hi[1];
			for (size_t k = 0; k < rem.n; k++)
				hits += i >= rem.v[k].lo[0] && i < rem.v[k].hi[0] && j >= rem.v[k].lo[1] && j < rem.v[k].hi[1];
			CHECK_EQ(hits, covered ? 0 : 1);
			left += !covered;
		}
	int64_t vol = 0;
	for (size_t k = 0; k < rem.n; k++)
		vol += vps_box_volume(&rem.v[k]);
	CHECK_EQ(vol, left);
	CHECK_EQ(left, 5 * 6 - 3 * 3);
	/* a cut that covers everything leaves nothing */
	CHECK_OK(vps_boxes_subtract(&rem, &scratch, &whole));
	CHECK_EQ(rem.n, 0);
	vps_boxes_release(&rem);
	vps_boxes_release(&scratch);
}
