/* Showing documents: any vps document in the other encoding, and what a
 * file is, in one line (vps-show(1)). */
#ifndef VPS_SHOW_H
#define VPS_SHOW_H

#include "vps/io.h"

#ifdef __cplusplus
extern "C" {
#endif

/* JSON: one object on one line, the YAML's keys in its order, hashes as
 * "0x..." strings; the tools read it as YAML. */
enum vps_show_encoding { VPS_SHOW_YAML, VPS_SHOW_BINARY, VPS_SHOW_JSON };

/* Read the document in data (name in messages) with its kind's reader,
 * which checks it as the tools that read it do, and write it in `to`: the
 * same values in the same order, stated hashes as stated (a damaged plan
 * stays damaged, for vps-verify to name). A document vps wrote comes back
 * byte for byte when converted back. Layouts, plans, staged plans, reports,
 * models, parallel configurations and devices convert; the kinds vps reads
 * only in YAML (topology, transition, budgets) do not (VPS_EINPUT).
 * @return VPS_EINPUT or VPS_EFORMAT naming the file for bad input. */
VPS_API vps_result_t vps_show_convert(const char *name, const void *data, size_t len, enum vps_show_encoding to,
			      struct vps_bytes *out);

/* What a document is, from its first fields. */
struct vps_show_info {
	enum vps_doc_kind kind;
	const char *encoding;   /* "binary", "yaml" or "json" */
	char model[64];         /* the model's name, "" where the kind has none */
	bool has_hash;
	uint64_t hash;          /* as the document states it */
	int64_t world_a;        /* a layout's world; a plan's source world; -1 where none */
	int64_t world_b;        /* a plan's target world; -1 where none */
	int64_t world;          /* a plan's transition world; a report's first switch's; -1 where none */
	int64_t rank;           /* a one-rank plan's or a report's rank; -1 for all */
	int64_t switches;       /* a report's; -1 for other kinds */
};

/* Identify the document in data. It is not checked beyond the fields read
 * (vps-verify checks): reading a plan's head does not read its pieces, so a
 * plan of millions of pieces is identified at once.
 * @return VPS_EFORMAT, with "not a vps document (WHY)" after the name, for
 * data that is none; VPS_EINPUT or VPS_EFORMAT with the reader's message for
 * a vps document whose first fields cannot be read. */
VPS_API vps_result_t vps_show_identify(const char *name, const void *data, size_t len, struct vps_show_info *info);

/* The line vps-show -t prints after "FILE: ", e.g.
 * "vps staged plan, model tiny-llama, world 8 -> 8 (12 ranks), hash 0x1234..., binary". */
VPS_API void vps_show_describe(const struct vps_show_info *info, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
