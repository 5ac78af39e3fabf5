/* Pictures of plans, as plain SVG (no plotting library).
 *
 * The traffic of a global plan: a heatmap of the bytes each source world
 * rank sends each destination (rows: sources, columns: destinations; the
 * colour on a log scale, with a legend), lines where consecutive world
 * ranks sit on different nodes, and bars of the bytes each rank sends (to
 * the right of its row) and receives (under its column). Retained bytes
 * do not travel and are not drawn. A world of more than VPS_SVG_MAX_CELLS
 * ranks is drawn in blocks of ceil(W / VPS_SVG_MAX_CELLS) consecutive
 * ranks: a cell sums its blocks' traffic, a bar shows the busiest rank of
 * its block; so the picture stays within VPS_SVG_MAX_CELLS squared cells
 * whatever the world. */
#ifndef VPS_SVG_H
#define VPS_SVG_H

#include "vps/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define VPS_SVG_MAX_CELLS 256

struct vps_bytes;
/* caption: a line under the title (a transition's name), or NULL.
 * VPS_EINPUT for a one-rank plan. */
VPS_API vps_result_t vps_plan_svg(const struct vps_plan *p, const char *caption, struct vps_bytes *out);

#ifdef __cplusplus
}
#endif

#endif
