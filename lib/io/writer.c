/* The document writer (io/doc.h): YAML through libyaml's emitter, JSON on
 * one line, and the binary encoding, fixed-width little-endian fields in a
 * zstd frame, held whole or compressed as it is written. */
#include <inttypes.h>
#include <stdio.h>
#include <yaml.h>
#include <zstd.h>

#include "io/doc.h"
#include "io/doc_int.h"
#include "util/internal.h"

struct vps_writer {
	bool yaml;
	bool failed;
	enum vps_doc_kind kind;
	struct vps_bytes out;  /* streaming: the payload not yet compressed */
	yaml_emitter_t emitter;
	bool emitter_ready;
	bool counting;         /* keep nothing, count the payload */
	uint64_t count;        /* payload bytes written */
	ZSTD_CCtx *z;          /* streaming: compressing into zout */
	struct vps_bytes zout;
	uint64_t pledged;      /* streaming: the payload's size */
	bool pending;          /* YAML: a sequence begun by vps_w_seq_begin_auto, its start not yet
				* emitted: its style waits for its first item */
	bool json;             /* text written here, not by libyaml (yaml is set too) */
	int depth;             /* json: open objects and arrays */
	bool started[VPS_DOC_MAX_DEPTH + 1]; /* json: the one at each depth has an item */
};

/* ---- JSON: one line, keys in the writer's order, hashes as strings ---- */

static vps_result_t json_put(struct vps_writer *w, const char *s)
{
	if (w->failed)
		return VPS_EINPUT;
	vps_result_t rc = vps_bytes_append(&w->out, s, strlen(s));
	if (rc)
		w->failed = true;
	return rc;
}

static vps_result_t json_string(struct vps_writer *w, const char *s)
{
	char esc[8];
	VPS_CHECK(json_put(w, "\""));
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			snprintf(esc, sizeof(esc), "\\%c", *p);
		else if (*p < 0x20)
			snprintf(esc, sizeof(esc), "\\u%04x", *p);
		else
			snprintf(esc, sizeof(esc), "%c", *p);
		VPS_CHECK(json_put(w, esc));
	}
	return json_put(w, "\"");
}

/* The separator before an item, and its key. */
static vps_result_t json_key(struct vps_writer *w, const char *key)
{
	if (w->depth > 0 && w->started[w->depth])
		VPS_CHECK(json_put(w, ", "));
	w->started[w->depth] = true;
	if (!key)
		return VPS_OK;
	VPS_CHECK(json_string(w, key));
	return json_put(w, ": ");
}

static vps_result_t json_open(struct vps_writer *w, const char *key, const char *bracket)
{
	if (w->depth >= VPS_DOC_MAX_DEPTH) {
		w->failed = true;
		return vps_fail(VPS_EINPUT, "json writer: nested deeper than %d levels", VPS_DOC_MAX_DEPTH);
	}
	VPS_CHECK(json_key(w, key));
	VPS_CHECK(json_put(w, bracket));
	w->started[++w->depth] = false;
	return VPS_OK;
}

static vps_result_t json_close(struct vps_writer *w, const char *bracket)
{
	if (w->depth <= 0) {
		w->failed = true;
		return vps_fail(VPS_EINPUT, "json writer: more ends than begins");
	}
	w->depth--;
	return json_put(w, bracket);
}

static vps_result_t json_scalar(struct vps_writer *w, const char *key, const char *text)
{
	VPS_CHECK(json_key(w, key));
	return json_put(w, text);
}

/* Payload a streaming writer holds before compressing it. */
#define STREAM_CHUNK ((size_t)1 << 20)

static int yaml_out(void *ctx, unsigned char *buf, size_t n)
{
	return vps_bytes_append(ctx, buf, n) == VPS_OK;
}

static vps_result_t emit(struct vps_writer *w, yaml_event_t *ev);

/* The start of a pending sequence, now that the next event is known: flow
 * when its items are scalars or sequences (numbers, pairs, boxes), block
 * when they are mappings, as the kinds' writers choose. */
static vps_result_t resolve_pending(struct vps_writer *w, yaml_event_type_t next)
{
	if (!w->pending)
		return VPS_OK;
	w->pending = false;
	yaml_event_t ev;
	yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
					     next == YAML_MAPPING_START_EVENT ? YAML_BLOCK_SEQUENCE_STYLE
									      : YAML_FLOW_SEQUENCE_STYLE);
	return emit(w, &ev);
}

static vps_result_t emit(struct vps_writer *w, yaml_event_t *ev)
{
	if (w->failed)
		return VPS_EINPUT;
	if (w->pending) {
		vps_result_t rc = resolve_pending(w, ev->type);
		if (rc) {
			yaml_event_delete(ev);
			return rc;
		}
	}
	if (!yaml_emitter_emit(&w->emitter, ev)) {
		w->failed = true;
		return vps_fail(VPS_EINPUT, "yaml emitter: %s",
				w->emitter.problem ? w->emitter.problem : "failed");
	}
	return VPS_OK;
}

static vps_result_t emit_scalar(struct vps_writer *w, const char *s, bool plain_only)
{
	yaml_event_t ev;
	yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1,
				     plain_only ? YAML_PLAIN_SCALAR_STYLE : YAML_ANY_SCALAR_STYLE);
	return emit(w, &ev);
}

static vps_result_t emit_key(struct vps_writer *w, const char *key)
{
	return key ? emit_scalar(w, key, false) : VPS_OK;
}

static ZSTD_CCtx *new_cctx(void)
{
	ZSTD_CCtx *c = ZSTD_createCCtx();
	if (c) {
		ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
		ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
		ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
	}
	return c;
}

/* Compress n bytes at p into the streaming writer's frame; end: close it. */
static vps_result_t stream_compress(struct vps_writer *w, const void *p, size_t n, bool end)
{
	ZSTD_inBuffer in = {p, n, 0};
	ZSTD_EndDirective mode = end ? ZSTD_e_end : ZSTD_e_continue;
	for (;;) {
		size_t room = ZSTD_CStreamOutSize();
		if (w->zout.cap - w->zout.len < room) {
			size_t ncap = vps_max64((int64_t)w->zout.cap * 2, (int64_t)(w->zout.len + room));
			unsigned char *d = realloc(w->zout.data, ncap);
			if (!d)
				return VPS_NOMEM();
			w->zout.data = d;
			w->zout.cap = ncap;
		}
		ZSTD_outBuffer o = {w->zout.data, w->zout.cap, w->zout.len};
		size_t left = ZSTD_compressStream2(w->z, &o, &in, mode);
		if (ZSTD_isError(left))
			return vps_fail(VPS_EINPUT, "zstd: %s", ZSTD_getErrorName(left));
		w->zout.len = o.pos;
		if (in.pos == in.size && (!end || !left))
			break;
	}
	return VPS_OK;
}

/* Compress what the streaming writer holds; end: close the frame. */
static vps_result_t stream_flush(struct vps_writer *w, bool end)
{
	VPS_CHECK(stream_compress(w, w->out.data, w->out.len, end));
	w->out.len = 0;
	return VPS_OK;
}

static vps_result_t bin_put_slow(struct vps_writer *w, const void *p, size_t n)
{
	if (w->counting)
		return w->failed ? VPS_EINPUT : VPS_OK;
	vps_result_t rc;
	if (w->z && n >= STREAM_CHUNK) {
		/* a block written by a thread goes to zstd as it is, not copied
		 * (zstd's frame is the same however its input is cut) */
		rc = stream_flush(w, false);
		if (!rc)
			rc = stream_compress(w, p, n, false);
	} else {
		rc = vps_bytes_append(&w->out, p, n);
		if (!rc && w->z && w->out.len >= STREAM_CHUNK)
			rc = stream_flush(w, false);
	}
	if (rc)
		w->failed = true;
	return rc;
}

/* Inline: a plan puts hundreds of millions of 8-byte values, nearly all
 * into room already there. */
static inline vps_result_t bin_put(struct vps_writer *w, const void *p, size_t n)
{
	w->count += n;
	if (!n) /* an empty array's data may be NULL */
		return VPS_OK;
	if (!w->counting && w->out.data && w->out.cap - w->out.len >= n && (!w->z || w->out.len + n < STREAM_CHUNK)) {
		memcpy(w->out.data + w->out.len, p, n);
		w->out.len += n;
		return VPS_OK;
	}
	return bin_put_slow(w, p, n);
}

static vps_result_t bin_u64(struct vps_writer *w, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	return bin_put(w, b, 8);
}

vps_result_t vps_writer_new(struct vps_writer **wp, enum vps_doc_kind kind, bool yaml)
{
	struct vps_writer *w = vps_calloc(1, sizeof(*w));
	if (!w)
		return VPS_ENOMEM;
	w->yaml = yaml;
	w->kind = kind;
	vps_result_t rc = VPS_OK;
	if (yaml) {
		yaml_event_t ev;
		if (!yaml_emitter_initialize(&w->emitter)) {
			free(w);
			return VPS_NOMEM();
		}
		w->emitter_ready = true;
		yaml_emitter_set_output(&w->emitter, yaml_out, &w->out);
		yaml_emitter_set_width(&w->emitter, -1);
		yaml_emitter_set_unicode(&w->emitter, 1);
		yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING);
		VPS_CHECK_GOTO(emit(w, &ev), rc, fail);
		yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1);
		VPS_CHECK_GOTO(emit(w, &ev), rc, fail);
		yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
		VPS_CHECK_GOTO(emit(w, &ev), rc, fail);
		VPS_CHECK_GOTO(vps_w_str(w, "vps", vps_doc_kind_name(kind)), rc, fail);
		VPS_CHECK_GOTO(vps_w_int(w, "version", vps_doc_version(kind)), rc, fail);
	} else {
		unsigned char hdr[VPS_DOC_HEADER_SIZE] = {0};
		memcpy(hdr, VPS_DOC_MAGIC, 4);
		hdr[4] = (unsigned char)kind;
		hdr[6] = (unsigned char)vps_doc_binary_version(kind);
		VPS_CHECK_GOTO(bin_put(w, hdr, sizeof(hdr)), rc, fail);
	}
	*wp = w;
	return VPS_OK;
fail:
	vps_writer_free(w);
	return rc;
}

vps_result_t vps_writer_new_json(struct vps_writer **wp, enum vps_doc_kind kind)
{
	struct vps_writer *w = vps_calloc(1, sizeof(*w));
	if (!w)
		return VPS_ENOMEM;
	w->yaml = w->json = true;
	w->kind = kind;
	vps_result_t rc;
	VPS_CHECK_GOTO(json_open(w, NULL, "{"), rc, fail);
	VPS_CHECK_GOTO(vps_w_str(w, "vps", vps_doc_kind_name(kind)), rc, fail);
	VPS_CHECK_GOTO(vps_w_int(w, "version", vps_doc_version(kind)), rc, fail);
	*wp = w;
	return VPS_OK;
fail:
	vps_writer_free(w);
	return rc;
}

vps_result_t vps_writer_new_counting(struct vps_writer **wp, enum vps_doc_kind kind)
{
	struct vps_writer *w = vps_calloc(1, sizeof(*w));
	if (!w)
		return VPS_ENOMEM;
	w->kind = kind;
	w->counting = true;
	*wp = w;
	return VPS_OK;
}

uint64_t vps_writer_count(const struct vps_writer *w) { return w->count; }

vps_result_t vps_writer_new_part(struct vps_writer **wp)
{
	struct vps_writer *w = vps_calloc(1, sizeof(*w));
	if (!w)
		return VPS_ENOMEM;
	*wp = w;
	return VPS_OK;
}

bool vps_writer_is_yaml(const struct vps_writer *w) { return w->yaml; }

void vps_writer_take(struct vps_writer *w, struct vps_bytes *out)
{
	*out = w->out;
	memset(&w->out, 0, sizeof(w->out));
}

vps_result_t vps_w_raw(struct vps_writer *w, const void *p, size_t n)
{
	if (w->yaml)
		return vps_fail(VPS_EINPUT, "document writer: raw bytes in YAML");
	return bin_put(w, p, n);
}

vps_result_t vps_writer_new_streaming(struct vps_writer **wp, enum vps_doc_kind kind, uint64_t payload)
{
	if (payload > VPS_DOC_MAX_BYTES)
		return vps_fail(VPS_EINPUT, "a %s document of %" PRIu64 " bytes is larger than any this build reads",
				vps_doc_kind_name(kind), payload);
	struct vps_writer *w = vps_calloc(1, sizeof(*w));
	if (!w)
		return VPS_ENOMEM;
	w->kind = kind;
	w->pledged = payload;
	vps_result_t rc = VPS_OK;
	unsigned char hdr[VPS_DOC_HEADER_SIZE] = {0};
	memcpy(hdr, VPS_DOC_MAGIC, 4);
	hdr[4] = (unsigned char)kind;
	hdr[6] = (unsigned char)vps_doc_binary_version(kind);
	w->z = new_cctx();
	if (!w->z)
		rc = VPS_NOMEM();
	if (!rc && ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(w->z, payload)))
		rc = vps_fail(VPS_EINPUT, "zstd: cannot stream %" PRIu64 " bytes", payload);
	if (!rc)
		rc = vps_bytes_append(&w->zout, hdr, sizeof(hdr));
	if (rc) {
		vps_writer_free(w);
		return rc;
	}
	*wp = w;
	return VPS_OK;
}

void vps_writer_free(struct vps_writer *w)
{
	if (!w)
		return;
	ZSTD_freeCCtx(w->z);
	vps_bytes_release(&w->zout);
	if (w->emitter_ready)
		yaml_emitter_delete(&w->emitter);
	vps_bytes_release(&w->out);
	free(w);
}

vps_result_t vps_writer_finish(struct vps_writer *w, struct vps_bytes *out)
{
	vps_result_t rc;
	if (w->failed)
		return vps_fail(VPS_EINPUT, "document writer failed earlier");
	if (w->counting) {
		memset(out, 0, sizeof(*out));
		return VPS_OK;
	}
	if (w->z) {
		if (w->count != w->pledged)
			return vps_fail(VPS_EINPUT, "document writer: %" PRIu64 " bytes written where %" PRIu64 " were counted",
					w->count, w->pledged);
		VPS_CHECK(stream_flush(w, true));
		*out = w->zout;
		memset(&w->zout, 0, sizeof(w->zout));
		return VPS_OK;
	}
	if (w->json) {
		VPS_CHECK(json_close(w, "}\n"));
		*out = w->out;
		memset(&w->out, 0, sizeof(w->out));
		return VPS_OK;
	}
	if (w->yaml) {
		yaml_event_t ev;
		yaml_mapping_end_event_initialize(&ev);
		VPS_CHECK(emit(w, &ev));
		yaml_document_end_event_initialize(&ev, 1);
		VPS_CHECK(emit(w, &ev));
		yaml_stream_end_event_initialize(&ev);
		VPS_CHECK(emit(w, &ev));
		if (!yaml_emitter_flush(&w->emitter))
			return vps_fail(VPS_EINPUT, "yaml emitter: flush failed");
		*out = w->out;
		memset(&w->out, 0, sizeof(w->out));
		return VPS_OK;
	}
	size_t payload = w->out.len - VPS_DOC_HEADER_SIZE;
	size_t bound = ZSTD_compressBound(payload);
	struct vps_bytes res = {0};
	rc = vps_bytes_append(&res, w->out.data, VPS_DOC_HEADER_SIZE);
	if (rc)
		return rc;
	unsigned char *dst = malloc(bound);
	if (!dst) {
		vps_bytes_release(&res);
		return VPS_NOMEM();
	}
	ZSTD_CCtx *cctx = new_cctx();
	size_t n = 0;
	if (!cctx) {
		rc = VPS_NOMEM();
		goto done;
	}
	n = ZSTD_compress2(cctx, dst, bound, w->out.data + VPS_DOC_HEADER_SIZE, payload);
	if (ZSTD_isError(n)) {
		rc = vps_fail(VPS_EINPUT, "zstd: %s", ZSTD_getErrorName(n));
		goto done;
	}
	rc = vps_bytes_append(&res, dst, n);
done:
	ZSTD_freeCCtx(cctx);
	free(dst);
	if (rc) {
		vps_bytes_release(&res);
		return rc;
	}
	*out = res;
	return VPS_OK;
}

vps_result_t vps_w_map_begin(struct vps_writer *w, const char *key)
{
	if (!w->yaml)
		return w->failed ? VPS_EINPUT : VPS_OK;
	if (w->json)
		return json_open(w, key, "{");
	yaml_event_t ev;
	VPS_CHECK(emit_key(w, key));
	yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
	return emit(w, &ev);
}

vps_result_t vps_w_map_end(struct vps_writer *w)
{
	if (!w->yaml)
		return w->failed ? VPS_EINPUT : VPS_OK;
	if (w->json)
		return json_close(w, "}");
	yaml_event_t ev;
	yaml_mapping_end_event_initialize(&ev);
	return emit(w, &ev);
}

vps_result_t vps_w_seq_begin(struct vps_writer *w, const char *key, uint64_t n, bool flow)
{
	if (!w->yaml)
		return bin_u64(w, n);
	if (w->json)
		return json_open(w, key, "[");
	yaml_event_t ev;
	VPS_CHECK(emit_key(w, key));
	yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
					     flow ? YAML_FLOW_SEQUENCE_STYLE : YAML_BLOCK_SEQUENCE_STYLE);
	return emit(w, &ev);
}

vps_result_t vps_w_seq_begin_auto(struct vps_writer *w, const char *key, uint64_t n)
{
	if (!w->yaml)
		return bin_u64(w, n);
	if (w->json)
		return json_open(w, key, "[");
	VPS_CHECK(emit_key(w, key));
	/* a sequence whose first item is this one is a sequence of sequences */
	VPS_CHECK(resolve_pending(w, YAML_SEQUENCE_START_EVENT));
	w->pending = true;
	return VPS_OK;
}

vps_result_t vps_w_seq_end(struct vps_writer *w)
{
	if (!w->yaml)
		return w->failed ? VPS_EINPUT : VPS_OK;
	if (w->json)
		return json_close(w, "]");
	yaml_event_t ev;
	yaml_sequence_end_event_initialize(&ev);
	return emit(w, &ev);
}

vps_result_t vps_w_int(struct vps_writer *w, const char *key, int64_t v)
{
	if (!w->yaml)
		return bin_u64(w, (uint64_t)v);
	char buf[32];
	snprintf(buf, sizeof(buf), "%" PRId64, v);
	if (w->json)
		return json_scalar(w, key, buf);
	VPS_CHECK(emit_key(w, key));
	return emit_scalar(w, buf, true);
}

vps_result_t vps_w_u64hex(struct vps_writer *w, const char *key, uint64_t v)
{
	if (!w->yaml)
		return bin_u64(w, v);
	char buf[32];
	snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
	/* a string: JSON's numbers are doubles to most of its readers */
	if (w->json) {
		VPS_CHECK(json_key(w, key));
		return json_string(w, buf);
	}
	VPS_CHECK(emit_key(w, key));
	return emit_scalar(w, buf, true);
}

vps_result_t vps_w_double(struct vps_writer *w, const char *key, double v)
{
	if (!w->yaml) {
		uint64_t bits;
		memcpy(&bits, &v, 8);
		return bin_u64(w, bits);
	}
	char buf[40];
	/* The shortest form that reads back as the same double, so that a
	 * round trip through binary prints the same text. */
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	if (!strpbrk(buf, ".eEn"))
		strcat(buf, ".0");
	if (w->json)
		return json_scalar(w, key, buf);
	VPS_CHECK(emit_key(w, key));
	return emit_scalar(w, buf, true);
}

vps_result_t vps_w_bool(struct vps_writer *w, const char *key, bool v)
{
	if (!w->yaml) {
		unsigned char b = v;
		return bin_put(w, &b, 1);
	}
	if (w->json)
		return json_scalar(w, key, v ? "true" : "false");
	VPS_CHECK(emit_key(w, key));
	return emit_scalar(w, v ? "true" : "false", true);
}

vps_result_t vps_w_str(struct vps_writer *w, const char *key, const char *s)
{
	if (!w->yaml) {
		size_t n = strlen(s);
		unsigned char b[4] = {(unsigned char)n, (unsigned char)(n >> 8),
				      (unsigned char)(n >> 16), (unsigned char)(n >> 24)};
		if (n > UINT32_MAX)
			return vps_fail(VPS_EINPUT, "string too long");
		VPS_CHECK(bin_put(w, b, 4));
		return bin_put(w, s, n);
	}
	if (w->json) {
		VPS_CHECK(json_key(w, key));
		return json_string(w, s);
	}
	VPS_CHECK(emit_key(w, key));
	return emit_scalar(w, s, false);
}

vps_result_t vps_w_int_sparse(struct vps_writer *w, const char *key, int64_t v, int64_t def)
{
	return v != def || !vps_writer_is_yaml(w) ? vps_w_int(w, key, v) : VPS_OK;
}

vps_result_t vps_w_bool_sparse(struct vps_writer *w, const char *key, bool v, bool def)
{
	return v != def || !vps_writer_is_yaml(w) ? vps_w_bool(w, key, v) : VPS_OK;
}

vps_result_t vps_w_str_sparse(struct vps_writer *w, const char *key, const char *s, const char *def)
{
	return strcmp(s, def) || !vps_writer_is_yaml(w) ? vps_w_str(w, key, s) : VPS_OK;
}
