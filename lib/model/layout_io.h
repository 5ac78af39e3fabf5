/* Layouts, boxes and integer lists inside documents (plans embed their
 * layouts). */
#ifndef VPS_LAYOUT_IO_H
#define VPS_LAYOUT_IO_H

#include "io/doc.h"
#include "vps/layout.h"

vps_result_t vps_box_write(struct vps_writer *w, const char *key, const struct vps_box *b);
vps_result_t vps_box_read(struct vps_reader *r, const char *key, struct vps_box *b);
/* Whether box b is not empty and lies in tensor t (what vps_box_check
 * refuses otherwise: a caller with millions of boxes names one only when
 * it fails). */
bool vps_box_ok(const struct vps_box *b, const struct vps_tensor *t);
/* Refuse (VPS_EINPUT, naming the file, key and `what`) a box that is empty
 * or leaves tensor t. */
vps_result_t vps_box_check(struct vps_reader *r, const char *key, const char *what, const struct vps_box *b,
			   const struct vps_tensor *t);
/* Refuse a view with a zero stride, or whose elements leave [0, elements)
 * of its buffer (elements < 0: a buffer of unknown size, [0, 2^48)). */
vps_result_t vps_view_check(struct vps_reader *r, const char *key, const char *what, int ndim, const int64_t *ext,
			    int64_t offset, const int64_t *strides, uint32_t buffer, int64_t elements);
/* Whether vps_view_check takes the view. */
bool vps_view_ok(int ndim, const int64_t *ext, int64_t offset, const int64_t *strides, int64_t elements);
vps_result_t vps_ints_write(struct vps_writer *w, const char *key, const int64_t *v, int n);
/* The body of a layout document (after the header), also embedded in plans. */
vps_result_t vps_layout_write(struct vps_writer *w, const struct vps_layout *l, const int64_t *ranks, size_t nranks);
vps_result_t vps_layout_read(struct vps_reader *r, struct vps_layout **out);
/* The same, with the hash the document states (not compared: a layout's
 * hash names it, vps_layout_hash computes it). */
vps_result_t vps_layout_read_stated(struct vps_reader *r, struct vps_layout **out, uint64_t *stated);

#endif
