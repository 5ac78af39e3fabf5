/* Staged plans inside documents. */
#ifndef VPS_STAGE_IO_H
#define VPS_STAGE_IO_H

#include "io/doc.h"
#include "vps/stage.h"

/* Read a staged document's body (after the header) into s, which the
 * caller allocated zeroed and frees with vps_staged_free, read or not. */
vps_result_t vps_staged_read_body(struct vps_reader *r, struct vps_staged *s);

#endif
