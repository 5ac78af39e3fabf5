/* Files and documents: reading inputs, writing outputs safely. */
#ifndef VPS_IO_H
#define VPS_IO_H

#include "vps/base.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* A set of kinds, one bit each: VPS_DOC_BIT(VPS_DOC_PLAN) | VPS_DOC_BIT(VPS_DOC_STAGED). */
#define VPS_DOC_BIT(kind) (1u << (unsigned)(kind))
/* The error for a document of kind `found` where one of the kinds in
 * `expected` was: what the file is, what was expected, and what makes one
 * ("a.layout: a layout, not a staged plan (vps-plan A B | vps-stage
 * --budget SIZE - -o FILE makes one)"); name is the file, with its line
 * for YAML. One table says what makes each kind, for every reader.
 * @return VPS_EINPUT */
VPS_API vps_result_t vps_doc_wrong_kind(const char *name, enum vps_doc_kind found, unsigned expected);

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

/* ---- records: a table written in a format ----
 * YAML (a sequence, one flow mapping a line), TSV (a header line of the
 * column names, then one line a record) or JSON lines (one object a line). */
struct vps_box;
enum vps_format { VPS_FORMAT_YAML = 0, VPS_FORMAT_TSV, VPS_FORMAT_JSON };
/* "yaml", "tsv" or "json". @return VPS_EINPUT for anything else. */
VPS_API vps_result_t vps_format_parse(const char *s, enum vps_format *f);

enum vps_field_type {
	VPS_FIELD_INT,  /* int64 */
	VPS_FIELD_STR,  /* text; escaped as each format needs */
	VPS_FIELD_BOX,  /* TSV: LO:HI,LO:HI; YAML and JSON: [[LO, HI], ...] */
	VPS_FIELD_INTS, /* TSV: A,B; YAML and JSON: [A, B] */
};
struct vps_field {
	const char *name;
	enum vps_field_type type;
};
/* One value of a record; which member counts follows the field's type. */
struct vps_value {
	int64_t i;
	const char *s;
	const struct vps_box *box;
	const int64_t *ints;
	int nints;
};

struct vps_records {
	struct vps_bytes *out;
	enum vps_format format;
	const struct vps_field *fields;
	size_t nfields;
	size_t n; /* records written */
};
/* Start a table in out (TSV: its header line). */
VPS_API vps_result_t vps_records_begin(struct vps_records *r, struct vps_bytes *out, enum vps_format format,
				       const struct vps_field *fields, size_t nfields);
/* Append one record: v holds nfields values, in the fields' order. */
VPS_API vps_result_t vps_records_put(struct vps_records *r, const struct vps_value *v);
/* Finish the table (YAML: "[]" when it has no record, so that the output
 * is an empty sequence, not an empty document). */
VPS_API vps_result_t vps_records_end(struct vps_records *r);

#ifdef __cplusplus
}
#endif

#endif
