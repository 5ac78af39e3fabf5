/* A staged plan's copies as runs (plan/piece.h): what vps-verify and the
 * queries over staged plans match back to the plan's pieces. */
#ifndef VPS_STAGE_OP_H
#define VPS_STAGE_OP_H

#include "plan/piece.h"
#include "vps/stage.h"

/* Copy o of transfer x as a run. */
void vps_op_run(const struct vps_xfer *x, const struct vps_op *o, struct vps_run *r);

#endif
