/* Documents: one serializer interface, two encodings.
 *
 * Each file kind (layout, plan, staged plan, ...) is written by one function
 * that calls the writer below and read by one function that calls the reader.
 * The YAML encoding looks values up by key (any key order, unknown keys are
 * errors with their line); the binary encoding stores the same values in the
 * writer's order, little-endian and fixed width, inside a zstd frame with a
 * content checksum. A value written then read gives back the same value in
 * either encoding, which makes YAML -> binary -> YAML byte-identical. */
#ifndef VPS_DOC_H
#define VPS_DOC_H

#include <stdio.h>

#include "vps/io.h"

#define VPS_DOC_MAGIC "\x89VPS"
#define VPS_DOC_HEADER_SIZE 16

/* The highest version this build reads and the version it writes, per kind. */
int vps_doc_version(enum vps_doc_kind kind);
/* vps_doc_wrong_kind's message, returning rc (a binary header's kind is
 * VPS_EFORMAT, a YAML document's VPS_EINPUT). */
vps_result_t vps_doc_kind_fail(vps_result_t rc, const char *name, enum vps_doc_kind found, unsigned expected);

/* Fields added to the binary encoding of several kinds at once, which
 * readers of an older binary version fill with their defaults. */
enum vps_doc_feature {
	VPS_FEATURE_OPTIMIZER, /* a parallel map's optimizer, scalar, exp_avg, exp_avg_sq, precision_aware */
	VPS_FEATURE_FAMILY,    /* a parallel map's family, dp_replicate, dp_shard */
	VPS_FEATURE_RELAY_MODE, /* a plan's relay mode and the bandwidths it weighed (before: a bool) */
	VPS_FEATURE_OFFLOAD,    /* a parallel map's offload; a rank view's buffers' host flag */
	VPS_NFEATURES
};

/* ---- writer ---- */
struct vps_writer;

/* Start a document of the given kind; yaml selects the encoding. The header
 * (`vps: KIND`, `version: N` in YAML) is written here. */
vps_result_t vps_writer_new(struct vps_writer **w, enum vps_doc_kind kind, bool yaml);
/* A YAML writer that writes JSON instead: one object on one line, in the
 * same order, hashes as "0x..." strings (JSON is YAML: the YAML reader
 * reads it back). */
vps_result_t vps_writer_new_json(struct vps_writer **w, enum vps_doc_kind kind);
/* Finish the document and hand its bytes to *out (caller releases). */
vps_result_t vps_writer_finish(struct vps_writer *w, struct vps_bytes *out);
void vps_writer_free(struct vps_writer *w);

/* Binary documents too large to hold uncompressed (a global plan at 16,384
 * ranks is 1.3 GB before compression) are written twice: once to a counting
 * writer, which keeps nothing and measures the payload, then to a streaming
 * writer told that size, which compresses as it goes (the zstd frame states
 * its content size, as every document's does). Both are finished with
 * vps_writer_finish; the counting one yields no bytes, only its count. */
vps_result_t vps_writer_new_counting(struct vps_writer **w, enum vps_doc_kind kind);
uint64_t vps_writer_count(const struct vps_writer *w);
vps_result_t vps_writer_new_streaming(struct vps_writer **w, enum vps_doc_kind kind, uint64_t payload);

/* A binary writer of a part of a payload, for threads writing parts of one
 * document: no header, no compression. vps_writer_take hands over what it
 * wrote (and empties it); vps_w_raw appends such a part to another binary
 * writer. */
vps_result_t vps_writer_new_part(struct vps_writer **w);
bool vps_writer_is_yaml(const struct vps_writer *w);
void vps_writer_take(struct vps_writer *w, struct vps_bytes *out);
vps_result_t vps_w_raw(struct vps_writer *w, const void *p, size_t n);

/* key is the mapping key, or NULL for an item of a sequence. flow asks YAML
 * for the compact [a, b] style. */
vps_result_t vps_w_map_begin(struct vps_writer *w, const char *key);
vps_result_t vps_w_map_end(struct vps_writer *w);
vps_result_t vps_w_seq_begin(struct vps_writer *w, const char *key, uint64_t n, bool flow);
/* A sequence whose YAML style its first item chooses: flow for scalars and
 * sequences, block for mappings (the choice every kind's writer makes, but
 * for the block list of [node, gpu] pairs of a devices map). */
vps_result_t vps_w_seq_begin_auto(struct vps_writer *w, const char *key, uint64_t n);
vps_result_t vps_w_seq_end(struct vps_writer *w);
vps_result_t vps_w_int(struct vps_writer *w, const char *key, int64_t v);
vps_result_t vps_w_u64hex(struct vps_writer *w, const char *key, uint64_t v);
vps_result_t vps_w_double(struct vps_writer *w, const char *key, double v);
vps_result_t vps_w_bool(struct vps_writer *w, const char *key, bool v);
vps_result_t vps_w_str(struct vps_writer *w, const char *key, const char *s);
/* Keys added after a kind's first version: binary has every field, YAML the
 * key only when it is not the default, so documents that do not use the
 * feature read and print as they did before it existed. */
vps_result_t vps_w_int_sparse(struct vps_writer *w, const char *key, int64_t v, int64_t def);
vps_result_t vps_w_bool_sparse(struct vps_writer *w, const char *key, bool v, bool def);
vps_result_t vps_w_str_sparse(struct vps_writer *w, const char *key, const char *s, const char *def);

/* ---- reader ---- */
struct vps_reader;

/* Parse bytes (YAML or binary, told apart by the magic) named `name` in
 * messages. The document must be of `kind` (`vps:` key / header) and of a
 * version this build reads; kind 0 accepts any and skips the header check,
 * for foreign YAML/JSON such as a Hugging Face config.json. A binary
 * document is decompressed as it is read: data must stay valid until
 * vps_reader_free, and its checksum is checked by vps_reader_finish. */
vps_result_t vps_reader_new(struct vps_reader **r, const char *name, const void *data, size_t len,
			    enum vps_doc_kind kind);
void vps_reader_free(struct vps_reader *r);
bool vps_reader_is_binary(const struct vps_reader *r);
/* Whether the document has a feature's fields: YAML always (its keys are
 * optional), binary from the version that brought them. */
bool vps_reader_has(const struct vps_reader *r, enum vps_doc_feature f);
const char *vps_reader_name(const struct vps_reader *r);
/* Finish: in binary, trailing bytes are an error. */
vps_result_t vps_reader_finish(struct vps_reader *r);
/* From now on every value read (and every mapping and sequence entered and
 * left) is also written to w, with its key: the document read in the
 * other encoding, the values as they were read, hashes included. A kind's
 * reader reads its fields in its writer's order (the binary encoding is
 * that order), so reading a document through its reader converts it;
 * YAML defaults are written out, as the binary encoding has every field.
 * Sequences take their style from their items (vps_w_seq_begin_auto)
 * unless begun with vps_r_seq_begin_flow. Attach after vps_reader_new:
 * the header is the writer's own. */
void vps_reader_echo(struct vps_reader *r, struct vps_writer *w);
/* The echo's writer, or NULL: a reader of a sparse map writes it itself. */
struct vps_writer *vps_reader_echo_writer(const struct vps_reader *r);

vps_result_t vps_r_map_begin(struct vps_reader *r, const char *key);
/* Ends the mapping; in YAML a key that was never read is an error. */
vps_result_t vps_r_map_end(struct vps_reader *r);
/* Ends the mapping, ignoring keys never read (foreign documents). */
vps_result_t vps_r_map_end_lenient(struct vps_reader *r);
vps_result_t vps_r_seq_begin(struct vps_reader *r, const char *key, uint64_t *n);
/* The same, with the YAML style an echo writes it in (vps_reader_echo). */
vps_result_t vps_r_seq_begin_flow(struct vps_reader *r, const char *key, uint64_t *n, bool flow);
vps_result_t vps_r_seq_end(struct vps_reader *r);
vps_result_t vps_r_int(struct vps_reader *r, const char *key, int64_t *v, int64_t min, int64_t max);
vps_result_t vps_r_u64hex(struct vps_reader *r, const char *key, uint64_t *v);
vps_result_t vps_r_double(struct vps_reader *r, const char *key, double *v);
vps_result_t vps_r_bool(struct vps_reader *r, const char *key, bool *v);
/* *s is owned by the reader and valid until vps_reader_free. */
vps_result_t vps_r_str(struct vps_reader *r, const char *key, const char **s);

/* YAML only: whether the current mapping has the key (always false in binary,
 * where every key the writer wrote is present in order). */
bool vps_r_has(struct vps_reader *r, const char *key);
/* Read with a default when the YAML mapping lacks the key. */
vps_result_t vps_r_int_opt(struct vps_reader *r, const char *key, int64_t *v, int64_t min,
			   int64_t max, int64_t def);
vps_result_t vps_r_bool_opt(struct vps_reader *r, const char *key, bool *v, bool def);
vps_result_t vps_r_str_opt(struct vps_reader *r, const char *key, const char **s, const char *def);
/* The readers of vps_w_*_sparse keys: an echo writes them sparsely too. */
vps_result_t vps_r_int_sparse(struct vps_reader *r, const char *key, int64_t *v, int64_t min, int64_t max,
			      int64_t def);
vps_result_t vps_r_bool_sparse(struct vps_reader *r, const char *key, bool *v, bool def);
vps_result_t vps_r_str_sparse(struct vps_reader *r, const char *key, const char **s, const char *def);

/* Fail with "NAME: line L: KEY: msg" pointing at the current or keyed node. */
vps_result_t vps_r_error(struct vps_reader *r, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Line of the keyed value in the current mapping (YAML), or 0. */
int vps_r_line(struct vps_reader *r, const char *key);

/* A config named on the command line: a path when it looks like one (a
 * '/', or ends in .yaml, .yml or .json, or is "-"), else NAME.yaml in the
 * first directory of the colon-separated search path that has it.
 * @return VPS_ENOTFOUND "no WHAT named 'NAME'; known: ..." (every name when
 * there are few, else "closest: ..." and how many) "(looked for ...)". */
vps_result_t vps_config_find(const char *arg, const char *search_path, const char *what, char *path, size_t n);
/* The NAMEs of the NAME.yaml files in the directories of search_path,
 * sorted, each once (*names NULL when there are none): what
 * vps_config_find finds. Freed with vps_config_names_free. */
vps_result_t vps_config_names(const char *search_path, char ***names, size_t *n);
void vps_config_names_free(char **names, size_t n);

#endif
