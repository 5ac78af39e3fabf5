/* The digest of a rank's part of a layout (docs/exec.md, The digest), over
 * host memory or, with a kernel where the bytes lie, GPU memory. */
#ifndef VPS_EXEC_DIGEST_H
#define VPS_EXEC_DIGEST_H

#include "vps/plan.h"

struct vps_cuda_api;

/* The sum over this rank's regions of the elements no lower-numbered rank
 * holds (vps_digest_region's, so the sum over ranks counts every replica
 * once whatever the layout). buffers[i] is the rank's buffer i in this
 * process: host memory, or GPU memory where where[i] is VPS_WHERE_CUDA
 * (where NULL: all host), which one digest kernel of gpu reads in place
 * (nothing is copied to the host). With lost devices
 * (vps-plan --lost) the source side (source) skips them as lower holders
 * and the target side leaves out the lost ranges, so both sides digest
 * what survived. */
vps_result_t vps_exec_digest_part(const struct vps_layout *l, int64_t rank, void *const *buffers,
				  const struct vps_lost *lost, bool source, const uint8_t *where,
				  const struct vps_cuda_api *gpu, uint64_t *digest);

#endif
