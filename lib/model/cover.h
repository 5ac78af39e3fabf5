/* Coverage helpers the library shares beyond vps/box.h. */
#ifndef VPS_MODEL_COVER_H
#define VPS_MODEL_COVER_H

#include "vps/box.h"

/* Elements the union of boxes[0..n) covers (0 for none), -1 when out of
 * memory. */
int64_t vps_boxes_union_volume(const struct vps_box *boxes, size_t n);

#endif
