/* Moving and checking element data: strided copies, the deterministic fill
 * pattern and the layout-independent digest. */
#ifndef VPS_DATA_H
#define VPS_DATA_H

#include "vps/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copy a box of extents ext (ndim axes) of esize-byte elements between two
 * strided views (strides in elements). Runs along a contiguous innermost
 * axis are copied with memcpy. */
/* Row-major element strides of an array of extents ext. */
VPS_API void vps_rowmajor_strides(const int64_t *ext, int ndim, int64_t *strides);
VPS_API void vps_copy_strided(void *dst, const int64_t *dst_strides, const void *src, const int64_t *src_strides,
		      const int64_t *ext, int ndim, size_t esize);

/* The fill pattern: the bits of element `index` (row-major in the logical
 * tensor) of (tensor, state) at training step `step`. bf16 states use the
 * low 16 bits. Depends on nothing else, so any rank can check its shards
 * alone. */
VPS_API uint32_t vps_fill_bits(uint32_t tensor, enum vps_state state, int64_t index, int64_t step);

/* Fill region r of a buffer (base address of the buffer) with the pattern. */
VPS_API void vps_fill_region(void *buffer, const struct vps_region *r, const struct vps_tensor *t, int64_t step);
/* Count the elements of region r that differ from the pattern. */
VPS_API int64_t vps_check_region(const void *buffer, const struct vps_region *r, const struct vps_tensor *t, int64_t step);

/* Digest of one region's elements: a sum mod 2^64 over elements of a hash
 * of (tensor, state, logical index, value bits), one multiply of the bits
 * by an odd key of the place (docs/exec.md, The digest). Sums of disjoint
 * parts add up, so the digest of a layout does not depend on how it is
 * cut; a change of one element always changes it, a change of several
 * almost always (2^-64, modelling the keys as random). */
VPS_API uint64_t vps_digest_region(const void *buffer, const struct vps_region *r, const struct vps_tensor *t);

#ifdef __cplusplus
}
#endif

#endif
