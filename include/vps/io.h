/* Files and documents: reading inputs, writing outputs safely. */
#ifndef VPS_IO_H
#define VPS_IO_H

#include "vps/base.h"

enum vps_doc_kind {
	VPS_DOC_LAYOUT = 1,
	VPS_DOC_PLAN = 2,
	VPS_DOC_STAGED = 3,
	VPS_DOC_REPORT = 4,
	VPS_DOC_MODEL = 5,
	VPS_DOC_DEVICES = 6,
	VPS_DOC_TOPOLOGY = 7,
	VPS_DOC_PARALLEL = 8,
	VPS_DOC_BUDGETS = 9,
	VPS_DOC_TRANSITION = 10,
};

VPS_API const char *vps_doc_kind_name(enum vps_doc_kind kind);

/* ---- growable byte buffer ---- */
struct vps_bytes {
	unsigned char *data;
	size_t len, cap;
};
VPS_API vps_result_t vps_bytes_append(struct vps_bytes *b, const void *p, size_t n);
VPS_API void vps_bytes_release(struct vps_bytes *b);

/* ---- files ---- */
/* Read a whole file, or standard input for "-". */
VPS_API vps_result_t vps_read_file(const char *path, struct vps_bytes *out);
/* Write bytes to path: a regular file (or none) is replaced whole, through a
 * temporary beside it and a rename, keeping its permissions (a new one is
 * 0644); a character device or a FIFO is written to where it is; a symbolic
 * link is followed and its target replaced, the link kept; anything else is
 * refused. "-" or NULL is standard output. Binary is refused on a terminal. */
VPS_API vps_result_t vps_write_output(const char *path, const struct vps_bytes *b, bool binary);
/* Whether bytes start with the binary magic. */
VPS_API bool vps_is_binary(const void *data, size_t len);
/* Kind of a binary document, or of a YAML one (its `vps:` key); 0 if unknown. */
VPS_API enum vps_doc_kind vps_doc_sniff(const void *data, size_t len);

#endif
