/* Boxes and regions of the Virtual Parameter Space.
 *
 * A box is a half-open axis-aligned range [lo, hi) in a tensor's logical
 * coordinates. A region is a box of one (tensor, state) together with where
 * it lives in one rank's buffer: element (i0..in) is at
 * offset + sum_k (ik - lo[k]) * strides[k], counted in elements. */
#ifndef VPS_BOX_H
#define VPS_BOX_H

#include "vps/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VPS_MAX_DIMS 4

struct vps_box {
	int ndim;
	int64_t lo[VPS_MAX_DIMS];
	int64_t hi[VPS_MAX_DIMS];
};

struct vps_region {
	uint32_t tensor;   /* global tensor id in the model's VPS */
	uint8_t state;     /* enum vps_state */
	uint8_t dtype;     /* 1 + enum vps_dtype, the state's as the layout holds it; 0
			    * (built without it): the state's usual one. vps_region_dtype */
	uint32_t buffer;   /* buffer index on the holding rank */
	struct vps_box box;
	int64_t offset;    /* element offset of box.lo in the buffer */
	int64_t strides[VPS_MAX_DIMS];
};

/* @return the number of elements in the box (0 when empty). */
VPS_API int64_t vps_box_volume(const struct vps_box *b);

/* @return true and the intersection in *out when a and b overlap. */
VPS_API bool vps_box_intersect(const struct vps_box *a, const struct vps_box *b, struct vps_box *out);

/* @return true when the boxes are equal. */
VPS_API bool vps_box_equal(const struct vps_box *a, const struct vps_box *b);
/* Order boxes of one ndim by their corners, lo before hi, axis by axis
 * (for sorting lists of them). */
VPS_API int vps_box_order(const struct vps_box *a, const struct vps_box *b);

/* @return true when outer contains inner. */
VPS_API bool vps_box_contains(const struct vps_box *outer, const struct vps_box *inner);

/* A box covering a whole tensor of the given shape. */
VPS_API void vps_box_full(struct vps_box *b, int ndim, const int64_t *shape);

/* Decompose the row-major range [lo, hi) of a tensor with extents ext into at
 * most 2*ndim-1 boxes, in increasing flat order (each box is contiguous).
 * starts[i], when not NULL, receives the flat index where box i begins.
 * @return the number of boxes written to out. */
VPS_API int vps_flat_range_boxes(int ndim, const int64_t *ext, int64_t lo, int64_t hi,
			 struct vps_box *out, int64_t *starts);

/* Write the parts of a not in b (at most 2*ndim boxes) to out.
 * @return the number of boxes written. */
VPS_API int vps_box_subtract(const struct vps_box *a, const struct vps_box *b, struct vps_box *out);

/* A growable list of boxes: what is left of a box after cuts. */
struct vps_boxes {
	struct vps_box *v;
	size_t n, cap;
};
VPS_API void vps_boxes_release(struct vps_boxes *b);
/* Make b the one box x. */
VPS_API vps_result_t vps_boxes_reset(struct vps_boxes *b, const struct vps_box *x);
VPS_API vps_result_t vps_boxes_push(struct vps_boxes *b, const struct vps_box *x);
/* b := b - cut; scratch is working space the caller keeps between calls
 * (its contents are lost; the two lists trade their arrays). */
VPS_API vps_result_t vps_boxes_subtract(struct vps_boxes *b, struct vps_boxes *scratch, const struct vps_box *cut);

/* Whether elements of extents ext[0..ndim) at these strides are the
 * row-major order of the extents: one contiguous range (extents of 1 may
 * have any stride). */
VPS_API bool vps_strides_rowmajor(int ndim, const int64_t *ext, const int64_t *strides);

/* Row-major strides of a box's extents. */
VPS_API void vps_box_rowmajor_strides(const struct vps_box *b, int64_t *strides);

/* @return the buffer offset of logical index idx in the region. */
VPS_API int64_t vps_region_offset_at(const struct vps_region *r, const int64_t *idx);

/* Restrict a region to sub (a box inside r->box), keeping its addressing. */
VPS_API void vps_region_restrict(const struct vps_region *r, const struct vps_box *sub, struct vps_region *out);

/* @return true when the region's elements occupy one contiguous buffer range
 * [offset, offset + volume) in row-major order of its box. */
VPS_API bool vps_region_is_contiguous(const struct vps_region *r);

/* Lowest and one-past-highest buffer offsets the region touches. */
VPS_API void vps_region_extent(const struct vps_region *r, int64_t *first, int64_t *end);

/* Union coverage of boxes inside target: writes up to max uncovered boxes to
 * gaps, returns their number (0: fully covered). */
VPS_API size_t vps_boxes_gaps(const struct vps_box *boxes, size_t n, const struct vps_box *target,
			      struct vps_box *gaps, size_t max);

/* Elements of target that no box covers (-1 when out of memory). */
VPS_API int64_t vps_boxes_uncovered(const struct vps_box *boxes, size_t n, const struct vps_box *target);

#ifdef __cplusplus
}
#endif

#endif
