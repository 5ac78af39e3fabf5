/* The transition world's shape, for the planner's bounds (lib/plan). */
#ifndef VPS_MODEL_WORLD_H
#define VPS_MODEL_WORLD_H

#include <stdbool.h>
#include "vps/layout.h"

/* Whether every device of layouts a and b is on one node: a world whose
 * NICs carry nothing, since no byte crosses nodes. */
bool vps_world_one_node(const struct vps_layout *a, const struct vps_layout *b);

#endif
