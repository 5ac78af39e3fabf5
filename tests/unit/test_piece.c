/* The piece geometry staging cuts copies with and vps-verify and the
 * queries match them back with (plan/piece.h): flat pieces, parts of
 * strided ones, and vps_piece_match as the inverse of vps_run_part. */
#include <string.h>

#include "harness.h"
#include "plan/piece.h"

/* A piece of box [lo, lo + ext) from rank 2's buffer 1 to rank 5's buffer 3. */
static struct vps_piece piece(int ndim, const int64_t *ext, int64_t src_offset, const int64_t *src_strides,
			      int64_t dst_offset, const int64_t *dst_strides)
{
	struct vps_piece x;
	memset(&x, 0, sizeof(x));
	x.tensor = 7;
	x.state = VPS_STATE_MAIN_PARAM;
	x.box.ndim = ndim;
	for (int k = 0; k < ndim; k++) {
		x.box.lo[k] = 10 * (k + 1);
		x.box.hi[k] = x.box.lo[k] + ext[k];
		x.src_strides[k] = src_strides[k];
		x.dst_strides[k] = dst_strides[k];
	}
	x.src = 2;
	x.dst = 5;
	x.src_buffer = 1;
	x.dst_buffer = 3;
	x.src_offset = src_offset;
	x.dst_offset = dst_offset;
	return x;
}

TEST(piece_run_flattens_pieces_contiguous_on_both_sides)
{
	const int64_t ext[2] = {3, 4}, rowmajor[2] = {4, 1}, wide[2] = {8, 1};
	struct vps_piece x = piece(2, ext, 100, rowmajor, 40, rowmajor);
	struct vps_run r;
	CHECK(vps_piece_run(&x, &r));
	CHECK(vps_piece_flat(&x));
	CHECK_EQ(r.ndim, 1);
	CHECK_EQ(r.ext[0], 12);
	CHECK_EQ(r.ext[1], 0);
	CHECK_EQ(r.src_strides[0], 1);
	CHECK_EQ(r.dst_strides[0], 1);
	CHECK_EQ(r.src_strides[1], 0);
	CHECK_EQ(r.src_offset, 100);
	CHECK_EQ(r.dst_offset, 40);
	CHECK_EQ(r.esize, 4);
	CHECK_EQ(r.src, 2);
	CHECK_EQ(r.dst, 5);
	CHECK_EQ(r.src_buffer, 1);
	CHECK_EQ(r.dst_buffer, 3);

	/* an axis of one element may have any stride */
	const int64_t one_row[2] = {1, 4}, odd[2] = {999, 1};
	x = piece(2, one_row, 0, odd, 0, rowmajor);
	CHECK(vps_piece_flat(&x));

	/* a column slice of a wider buffer on one side: strided, as its box */
	x = piece(2, ext, 0, rowmajor, 0, wide);
	CHECK(!vps_piece_run(&x, &r));
	CHECK(!vps_piece_flat(&x));
	CHECK_EQ(r.ndim, 2);
	CHECK_EQ(r.ext[0], 3);
	CHECK_EQ(r.ext[1], 4);
	CHECK_EQ(r.dst_strides[0], 8);
	CHECK_EQ(r.src_strides[0], 4);
	x = piece(2, ext, 0, wide, 0, rowmajor);
	CHECK(!vps_piece_flat(&x));

	/* bf16 parameters: two bytes an element */
	x.state = VPS_STATE_PARAM;
	vps_piece_run(&x, &r);
	CHECK_EQ(r.esize, 2);
}

TEST(run_part_moves_the_offsets_to_its_first_element)
{
	const int64_t ext[3] = {3, 4, 5}, src[3] = {40, 5, 1}, dst[3] = {200, 10, 1};
	struct vps_piece x = piece(3, ext, 7, src, 1000, dst);
	struct vps_run r, p = {0};
	vps_piece_run(&x, &r);
	const int64_t lo[3] = {2, 1, 3}, sub[3] = {1, 2, 2};
	CHECK(vps_run_part(&r, lo, sub, &p));
	CHECK_EQ(p.src_offset, 7 + 2 * 40 + 1 * 5 + 3);
	CHECK_EQ(p.dst_offset, 1000 + 2 * 200 + 1 * 10 + 3);
	for (int k = 0; k < 3; k++) {
		CHECK_EQ(p.ext[k], sub[k]);
		CHECK_EQ(p.src_strides[k], src[k]);
		CHECK_EQ(p.dst_strides[k], dst[k]);
	}
	CHECK_EQ(p.ext[3], 0);

	/* an offset past int64 is refused, not wrapped */
	const int64_t huge[3] = {INT64_MAX / 2, 5, 1};
	r.src_strides[0] = huge[0];
	CHECK(!vps_run_part(&r, lo, sub, &p));
}

/* Every sub-box of a strided piece, cut by vps_run_part, is matched back
 * by vps_piece_match to exactly that sub-box. */
static void check_every_part(const struct vps_piece *x)
{
	struct vps_run r;
	CHECK(!vps_piece_run(x, &r));
	int nd = r.ndim;
	int64_t lo[VPS_MAX_DIMS] = {0}, ext[VPS_MAX_DIMS] = {0};
	int64_t cases = 1;
	for (int k = 0; k < nd; k++)
		cases *= r.ext[k] * r.ext[k];
	for (int64_t c = 0; c < cases; c++) {
		int64_t rest = c;
		bool inside = true;
		for (int k = 0; k < nd; k++) {
			lo[k] = rest % r.ext[k];
			rest /= r.ext[k];
			ext[k] = rest % r.ext[k] + 1;
			rest /= r.ext[k];
			inside &= lo[k] + ext[k] <= r.ext[k];
		}
		if (!inside)
			continue;
		struct vps_run part = {0};
		struct vps_box sub;
		CHECK(vps_run_part(&r, lo, ext, &part));
		CHECK_EQ(vps_piece_match(x, &part, &sub), VPS_MATCH_BOX);
		CHECK_EQ(sub.ndim, nd);
		for (int k = 0; k < nd; k++) {
			CHECK_EQ(sub.lo[k], lo[k]);
			CHECK_EQ(sub.hi[k], lo[k] + ext[k]);
		}
	}
}

TEST(match_finds_every_part_of_a_strided_piece)
{
	/* a row-parallel slice: strided on the destination */
	const int64_t e2[2] = {3, 4}, s2[2] = {4, 1}, d2[2] = {16, 1};
	struct vps_piece x = piece(2, e2, 12, s2, 33, d2);
	check_every_part(&x);
	/* strided on both sides, three axes */
	const int64_t e3[3] = {2, 3, 4}, s3[3] = {60, 8, 1}, d3[3] = {100, 20, 2};
	x = piece(3, e3, 0, s3, 5, d3);
	check_every_part(&x);
	/* one axis */
	const int64_t e1[1] = {6}, s1[1] = {1}, d1[1] = {3};
	x = piece(1, e1, 9, s1, 0, d1);
	check_every_part(&x);
}

TEST(match_refuses_what_is_not_a_part)
{
	const int64_t ext[2] = {3, 4}, src[2] = {4, 1}, dst[2] = {16, 1};
	struct vps_piece x = piece(2, ext, 12, src, 33, dst);
	struct vps_run r, c = {0};
	struct vps_box sub;
	vps_piece_run(&x, &r);
	const int64_t lo[2] = {1, 1}, e[2] = {2, 2};
	CHECK(vps_run_part(&r, lo, e, &c));
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_BOX);

	struct vps_run bad = c;
	bad.src = 3; /* another pair */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.dst = 4;
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.src_buffer = 0; /* another buffer */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.dst_buffer = 0;
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.esize = 2; /* another element size */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.ndim = 1;
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.ext[1] = 0;
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.ext[1] = 5; /* longer than the piece */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.dst_strides[0] = 17; /* other addressing along an axis it spans */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.src_offset++; /* the sides disagree */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.src_offset = 11; /* before the piece on both sides */
	bad.dst_offset = 32;
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.dst_offset = INT64_MIN; /* the difference overflows */
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);
	bad = c;
	bad.src_offset = 12 + 3 * 4; /* the row past the piece's last, on both */
	bad.dst_offset = 33 + 3 * 16;
	CHECK_EQ(vps_piece_match(&x, &bad, &sub), VPS_MATCH_NONE);

	/* an axis of one element: its stride does not matter */
	const int64_t row[2] = {1, 4};
	CHECK(vps_run_part(&r, lo, row, &c));
	c.ext[1] = 3;
	c.src_strides[0] = c.dst_strides[0] = 12345;
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_BOX);
	CHECK_EQ(sub.lo[0], 1);
	CHECK_EQ(sub.hi[0], 2);
	CHECK_EQ(sub.lo[1], 1);
	CHECK_EQ(sub.hi[1], 4);
}

TEST(match_solves_from_the_side_whose_strides_nest)
{
	/* destination strides (3, 2) do not nest: elements i*3 + j*2 are
	 * distinct, but the largest stride first misses element (0, 2) at 4;
	 * the source's (3, 1) finds it, and both sides confirm it */
	const int64_t ext[2] = {3, 3}, src[2] = {3, 1}, dst[2] = {3, 2};
	struct vps_piece x = piece(2, ext, 0, src, 0, dst);
	struct vps_run r, c = {0};
	struct vps_box sub;
	vps_piece_run(&x, &r);
	const int64_t lo[2] = {0, 2}, one[2] = {1, 1};
	CHECK(vps_run_part(&r, lo, one, &c));
	CHECK_EQ(c.dst_offset, 4);
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_BOX);
	CHECK_EQ(sub.lo[0], 0);
	CHECK_EQ(sub.lo[1], 2);

	/* neither side nests: the part is there, but it is not guessed */
	const int64_t src2[2] = {3, 2};
	x = piece(2, ext, 0, src2, 0, dst);
	vps_piece_run(&x, &r);
	CHECK(vps_run_part(&r, lo, one, &c));
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_NONE);
}

TEST(match_leaves_flat_pieces_to_addresses)
{
	const int64_t ext[2] = {3, 4}, rowmajor[2] = {4, 1};
	struct vps_piece x = piece(2, ext, 100, rowmajor, 40, rowmajor);
	struct vps_run c;
	struct vps_box sub;
	/* a flat copy matches whatever pieces it merges: its addresses say which */
	memset(&c, 0, sizeof(c));
	c.ndim = 1;
	c.ext[0] = 1000;
	c.src_strides[0] = c.dst_strides[0] = 1;
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_FLAT);
	/* one contiguous range in more than one axis is flat too */
	c.ndim = 2;
	c.ext[0] = 2;
	c.ext[1] = 5;
	c.src_strides[0] = c.dst_strides[0] = 5;
	c.src_strides[1] = c.dst_strides[1] = 1;
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_FLAT);
	/* a copy of a flat piece with gaps is no part of it */
	c.ndim = 1;
	c.ext[0] = 4;
	c.src_strides[0] = 2;
	c.dst_strides[0] = 1;
	CHECK_EQ(vps_piece_match(&x, &c, &sub), VPS_MATCH_NONE);
}
