/* What the document writer (writer.c) and reader (reader.c) share; private
 * to lib/io. */
#ifndef VPS_DOC_INT_H
#define VPS_DOC_INT_H

#include "io/doc.h"

/* Largest decompressed document we accept: a guard against a corrupt size
 * field asking for an absurd allocation. */
#define VPS_DOC_MAX_BYTES ((uint64_t)64 << 30)

/* Deepest YAML nesting we accept. The deepest document vps writes nests
 * about 8 levels; libyaml's scanner walks its whole stack of open flow
 * collections for every token, so unbounded nesting makes parsing quadratic
 * (a 200 KB line of '[' took 37 s). */
#define VPS_DOC_MAX_DEPTH 64

/* The binary encoding's version of a kind (the header's byte 6), and the
 * oldest one its reader still takes. */
int vps_doc_binary_version(enum vps_doc_kind kind);
int vps_doc_binary_min(enum vps_doc_kind kind);
/* The binary version of a kind that brought a feature's fields. */
int vps_doc_feature_since(enum vps_doc_kind kind, enum vps_doc_feature f);
/* The kind a document names itself (`vps: NAME`), or 0. */
enum vps_doc_kind vps_doc_kind_from_name(const char *s);

#endif
