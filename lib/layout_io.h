/* Layouts, boxes and integer lists inside documents (plans embed their
 * layouts). */
#ifndef VPS_LAYOUT_IO_H
#define VPS_LAYOUT_IO_H

#include "doc.h"
#include "vps/layout.h"

vps_result_t vps_box_write(struct vps_writer *w, const char *key, const struct vps_box *b);
vps_result_t vps_box_read(struct vps_reader *r, const char *key, struct vps_box *b);
vps_result_t vps_ints_write(struct vps_writer *w, const char *key, const int64_t *v, int n);
/* The body of a layout document (after the header), also embedded in plans. */
vps_result_t vps_layout_write(struct vps_writer *w, const struct vps_layout *l, const int64_t *ranks, size_t nranks);
vps_result_t vps_layout_read(struct vps_reader *r, struct vps_layout **out);

#endif
