#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>
#include <zstd.h>

#include "io/doc.h"
#include "util/internal.h"

/* Largest decompressed document we accept: a guard against a corrupt size
 * field asking for an absurd allocation. */
#define VPS_DOC_MAX_BYTES ((uint64_t)64 << 30)

/* Deepest YAML nesting we accept. The deepest document vps writes nests
 * about 8 levels; libyaml's scanner walks its whole stack of open flow
 * collections for every token, so unbounded nesting makes parsing quadratic
 * (a 200 KB line of '[' took 37 s). */
#define VPS_DOC_MAX_DEPTH 64

/* The YAML version counts changes a YAML reader cannot absorb (keys are
 * optional, so new keys with defaults do not count). The binary encoding
 * writes every field in order, so any new field changes it: 2 for the
 * fields of November 2026 (cp, grouped_gemm, the DeepSeek-V3 model keys;
 * a report's connections). */
static const struct {
	enum vps_doc_kind kind;
	const char *name;
	int version, binary_version;
} doc_kinds[] = {
	{VPS_DOC_LAYOUT, "layout", 1, 2},     {VPS_DOC_PLAN, "plan", 1, 2},
	{VPS_DOC_STAGED, "staged", 1, 2},     {VPS_DOC_REPORT, "report", 1, 2},
	{VPS_DOC_MODEL, "model", 1, 2},       {VPS_DOC_DEVICES, "devices", 1, 1},
	{VPS_DOC_TOPOLOGY, "topology", 1, 1}, {VPS_DOC_PARALLEL, "parallel", 1, 2},
	{VPS_DOC_BUDGETS, "budgets", 1, 1},   {VPS_DOC_TRANSITION, "transition", 1, 2},
};

const char *vps_doc_kind_name(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].name;
	return "unknown";
}

int vps_doc_version(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].version;
	return 0;
}

static int binary_version(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].binary_version;
	return 0;
}

static enum vps_doc_kind kind_from_name(const char *s)
{
	for (size_t i = 0; i < sizeof(doc_kinds) / sizeof(doc_kinds[0]); i++)
		if (strcmp(doc_kinds[i].name, s) == 0)
			return doc_kinds[i].kind;
	return 0;
}

vps_result_t vps_bytes_append(struct vps_bytes *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		size_t ncap = b->cap ? b->cap : 4096;
		while (ncap < b->len + n)
			ncap *= 2;
		unsigned char *d = realloc(b->data, ncap);
		if (!d)
			return VPS_NOMEM();
		b->data = d;
		b->cap = ncap;
	}
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	return VPS_OK;
}

void vps_bytes_release(struct vps_bytes *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

uint64_t vps_hash64(const void *data, size_t len, uint64_t seed)
{
	const unsigned char *p = data;
	uint64_t h = vps_mix64(seed ^ (len * 0x9e3779b97f4a7c15ULL));
	while (len >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = vps_mix64(h ^ w) + 0x9e3779b97f4a7c15ULL;
		p += 8;
		len -= 8;
	}
	uint64_t w = 0;
	memcpy(&w, p, len);
	return vps_mix64(h ^ w ^ ((uint64_t)len << 56));
}

/* ======================================================================
 * Writer
 * ==================================================================== */

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

/* Compress what the streaming writer holds; end: close the frame. */
static vps_result_t stream_flush(struct vps_writer *w, bool end)
{
	ZSTD_inBuffer in = {w->out.data, w->out.len, 0};
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
	w->out.len = 0;
	return VPS_OK;
}

static vps_result_t bin_put(struct vps_writer *w, const void *p, size_t n)
{
	w->count += n;
	if (w->counting)
		return w->failed ? VPS_EINPUT : VPS_OK;
	vps_result_t rc = vps_bytes_append(&w->out, p, n);
	if (!rc && w->z && w->out.len >= STREAM_CHUNK)
		rc = stream_flush(w, false);
	if (rc)
		w->failed = true;
	return rc;
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
		hdr[6] = (unsigned char)binary_version(kind);
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
	hdr[6] = (unsigned char)binary_version(kind);
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

/* ======================================================================
 * Reader
 * ==================================================================== */

struct frame {
	int node;        /* YAML node id */
	bool is_seq;
	size_t next;     /* next sequence item */
	bool *used;      /* per mapping pair: read by the caller */
	size_t npairs;
};

/* The strings a binary reader hands out, interned: a plan names the
 * tensor of each of its millions of pieces, from a few hundred names. */
struct str_set {
	char **v;          /* in the order first seen */
	size_t n, cap;
	uint32_t *slot;    /* open addressing: index + 1, 0 empty */
	size_t mask;
};

static void str_set_free(struct str_set *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->v[i]);
	free(t->v);
	free(t->slot);
	memset(t, 0, sizeof(*t));
}

/* The interned copy of the n bytes at p (NULL when out of memory). */
static const char *str_set_add(struct str_set *t, const unsigned char *p, size_t n)
{
	uint64_t h = vps_hash64(p, n, 0x5354);
	if (t->slot) {
		for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
			uint32_t k = t->slot[i];
			if (!k)
				break;
			const char *c = t->v[k - 1];
			if (!strncmp(c, (const char *)p, n) && !c[n]) /* p holds no NUL: c ends no earlier than n */
				return c;
		}
	}
	if (t->n + 1 > UINT32_MAX - 1)
		return NULL;
	if (!t->slot || (t->n + 1) * 2 > t->mask + 1) {
		size_t size = t->slot ? (t->mask + 1) * 2 : 256;
		uint32_t *ns = calloc(size, sizeof(*ns));
		if (!ns)
			return NULL;
		for (size_t k = 0; k < t->n; k++) {
			size_t i = vps_hash64(t->v[k], strlen(t->v[k]), 0x5354) & (size - 1);
			while (ns[i])
				i = (i + 1) & (size - 1);
			ns[i] = (uint32_t)k + 1;
		}
		free(t->slot);
		t->slot = ns;
		t->mask = size - 1;
	}
	if (vps_grow((void **)&t->v, &t->cap, t->n + 1, sizeof(*t->v)))
		return NULL;
	char *c = malloc(n + 1);
	if (!c)
		return NULL;
	memcpy(c, p, n);
	c[n] = '\0';
	size_t i = h & t->mask;
	while (t->slot[i])
		i = (i + 1) & t->mask;
	t->slot[i] = (uint32_t)t->n + 1;
	t->v[t->n++] = c;
	return c;
}

struct vps_reader {
	char *name;
	bool binary;
	/* binary: the payload is decompressed as it is read, into a window
	 * holding bytes [wbase, wbase + wlen) of it (a plan of 16,384 ranks is
	 * 1.3 GB uncompressed); positions count from the payload's start */
	unsigned char *payload;
	size_t plen, pos;
	size_t wbase, wlen, wcap;
	ZSTD_DCtx *dctx;
	ZSTD_inBuffer zin;
	bool zdone;
	struct str_set strs; /* strings handed out, each once */
	/* yaml */
	yaml_document_t doc;
	bool doc_ready;
	struct frame *frames;
	size_t nframes, cap_frames;
	struct vps_writer *echo; /* vps_reader_echo: every value read is written here too */
};

void vps_reader_echo(struct vps_reader *r, struct vps_writer *w) { r->echo = w; }
struct vps_writer *vps_reader_echo_writer(const struct vps_reader *r) { return r->echo; }

bool vps_reader_is_binary(const struct vps_reader *r) { return r->binary; }
const char *vps_reader_name(const struct vps_reader *r) { return r->name; }

static yaml_node_t *node_at(struct vps_reader *r, int id) { return yaml_document_get_node(&r->doc, id); }

static int node_line(struct vps_reader *r, int id)
{
	yaml_node_t *n = node_at(r, id);
	return n ? (int)n->start_mark.line + 1 : 0;
}

static struct frame *top(struct vps_reader *r) { return r->nframes ? &r->frames[r->nframes - 1] : NULL; }

static vps_result_t push_frame(struct vps_reader *r, int node)
{
	VPS_CHECK(VPS_GROW(r->frames, r->cap_frames, r->nframes + 1));
	struct frame *f = &r->frames[r->nframes];
	memset(f, 0, sizeof(*f));
	f->node = node;
	yaml_node_t *n = node_at(r, node);
	if (n->type == YAML_SEQUENCE_NODE) {
		f->is_seq = true;
	} else {
		f->npairs = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
		f->used = vps_calloc(f->npairs ? f->npairs : 1, sizeof(bool));
		if (!f->used)
			return VPS_ENOMEM;
	}
	r->nframes++;
	return VPS_OK;
}

static void pop_frame(struct vps_reader *r)
{
	struct frame *f = top(r);
	free(f->used);
	r->nframes--;
}

/* Find the value node for key in the current mapping (or the next sequence
 * item when key is NULL); 0 when absent. Marks the pair read. */
static int lookup(struct vps_reader *r, const char *key, bool mark)
{
	struct frame *f = top(r);
	yaml_node_t *n = node_at(r, f->node);
	if (f->is_seq) {
		yaml_node_item_t *items = n->data.sequence.items.start;
		size_t count = (size_t)(n->data.sequence.items.top - items);
		if (f->next >= count)
			return 0;
		return mark ? items[f->next++] : items[f->next];
	}
	if (!key)
		return 0;
	yaml_node_pair_t *pairs = n->data.mapping.pairs.start;
	for (size_t i = 0; i < f->npairs; i++) {
		yaml_node_t *k = node_at(r, pairs[i].key);
		if (k && k->type == YAML_SCALAR_NODE && strlen(key) == k->data.scalar.length &&
		    memcmp(k->data.scalar.value, key, k->data.scalar.length) == 0) {
			if (mark)
				f->used[i] = true;
			return pairs[i].value;
		}
	}
	return 0;
}

int vps_r_line(struct vps_reader *r, const char *key)
{
	if (r->binary || !r->nframes)
		return 0;
	int id = lookup(r, key, false);
	return id ? node_line(r, id) : node_line(r, top(r)->node);
}

vps_result_t vps_r_error(struct vps_reader *r, const char *key, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (r->binary)
		return vps_fail(VPS_EINPUT, "%s: %s%s%s", r->name, key ? key : "", key ? ": " : "", msg);
	return vps_fail(VPS_EINPUT, "%s: line %d: %s%s%s", r->name, vps_r_line(r, key), key ? key : "",
			key ? ": " : "", msg);
}

/* The window of at least this many bytes: large enough that shifting it
 * costs little, small beside a 1.3 GB payload. */
#define WINDOW_BYTES ((size_t)4 << 20)

/* Make bytes [pos, pos + n) of the payload readable at AT(r). */
static vps_result_t bin_fill(struct vps_reader *r, size_t n)
{
	if (r->pos - r->wbase + n <= r->wlen)
		return VPS_OK;
	/* what was read is done with: keep the rest, from pos on */
	size_t drop = r->pos - r->wbase;
	memmove(r->payload, r->payload + drop, r->wlen - drop);
	r->wlen -= drop;
	r->wbase = r->pos;
	if (n > r->wcap) {
		size_t cap = vps_min64((int64_t)r->plen, (int64_t)vps_max64((int64_t)n, (int64_t)(2 * r->wcap)));
		unsigned char *d = realloc(r->payload, cap ? cap : 1);
		if (!d)
			return vps_fail(VPS_ENOMEM, "%s: out of memory for %zu bytes of the document", r->name, cap);
		r->payload = d;
		r->wcap = cap;
	}
	while (r->wlen < n) {
		ZSTD_outBuffer out = {r->payload, r->wcap, r->wlen};
		size_t ret = ZSTD_decompressStream(r->dctx, &out, &r->zin);
		if (ZSTD_isError(ret))
			return vps_fail(VPS_EFORMAT, "%s: corrupt document: %s", r->name, ZSTD_getErrorName(ret));
		bool stuck = out.pos == r->wlen && r->zin.pos == r->zin.size;
		r->wlen = out.pos;
		if (!ret)
			r->zdone = true;
		if (r->wlen < n && (r->zdone || stuck))
			return vps_fail(VPS_EFORMAT, "%s: corrupt document: size mismatch", r->name);
	}
	return VPS_OK;
}

#define AT(r) ((r)->payload + ((r)->pos - (r)->wbase))

static vps_result_t bin_need(struct vps_reader *r, size_t n)
{
	if (r->plen - r->pos < n)
		return vps_fail(VPS_EFORMAT, "%s: truncated document (needs %zu bytes at offset %zu of %zu)",
				r->name, n, r->pos, r->plen);
	return bin_fill(r, n);
}

static vps_result_t bin_u64_read(struct vps_reader *r, uint64_t *v)
{
	VPS_CHECK(bin_need(r, 8));
	uint64_t x = 0;
	for (int i = 0; i < 8; i++)
		x |= (uint64_t)AT(r)[i] << (8 * i);
	r->pos += 8;
	*v = x;
	return VPS_OK;
}

/* Value node for key, or an error naming the missing key. */
static vps_result_t need_node(struct vps_reader *r, const char *key, int *id)
{
	*id = lookup(r, key, true);
	if (!*id) {
		if (key)
			return vps_r_error(r, NULL, "missing key '%s'", key);
		return vps_r_error(r, NULL, "sequence is shorter than expected");
	}
	return VPS_OK;
}

static vps_result_t scalar_of(struct vps_reader *r, const char *key, int id, const char **s)
{
	yaml_node_t *n = node_at(r, id);
	if (n->type != YAML_SCALAR_NODE)
		return vps_fail(VPS_EINPUT, "%s: line %d: %s%sexpected a scalar value", r->name,
				node_line(r, id), key ? key : "", key ? ": " : "");
	*s = (const char *)n->data.scalar.value;
	return VPS_OK;
}

static vps_result_t check_header(struct vps_reader *r, enum vps_doc_kind kind)
{
	const char *s;
	int64_t version;
	if (!vps_r_has(r, "vps"))
		return vps_r_error(r, NULL, "not a vps %s document (no 'vps:' key)", vps_doc_kind_name(kind));
	VPS_CHECK(vps_r_str(r, "vps", &s));
	if (kind_from_name(s) != kind)
		return vps_r_error(r, "vps", "expected a %s document, found '%s'", vps_doc_kind_name(kind), s);
	VPS_CHECK(vps_r_int(r, "version", &version, 1, INT32_MAX));
	if (version > vps_doc_version(kind))
		return vps_fail(VPS_EFORMAT, "%s: line %d: %s version %" PRId64
				" is newer than this build reads (%d)",
				r->name, vps_r_line(r, "version"), vps_doc_kind_name(kind), version,
				vps_doc_version(kind));
	return VPS_OK;
}

static vps_result_t open_binary(struct vps_reader *r, const unsigned char *d, size_t len,
				enum vps_doc_kind kind)
{
	if (len < VPS_DOC_HEADER_SIZE)
		return vps_fail(VPS_EFORMAT, "%s: truncated header", r->name);
	unsigned dkind = d[4] | (unsigned)d[5] << 8, version = d[6] | (unsigned)d[7] << 8;
	uint32_t flags = d[8] | (uint32_t)d[9] << 8 | (uint32_t)d[10] << 16 | (uint32_t)d[11] << 24;
	if (kind && dkind != (unsigned)kind)
		return vps_fail(VPS_EFORMAT, "%s: expected a binary %s document, found kind %u (%s)", r->name,
				vps_doc_kind_name(kind), dkind, vps_doc_kind_name(dkind));
	if (version == 0)
		return vps_fail(VPS_EFORMAT, "%s: corrupt header: version 0", r->name);
	if ((int)version > binary_version(dkind))
		return vps_fail(VPS_EFORMAT, "%s: binary %s version %u is newer than this build reads (%d)", r->name,
				vps_doc_kind_name(dkind), version, binary_version(dkind));
	if ((int)version < binary_version(dkind))
		return vps_fail(VPS_EFORMAT,
				"%s: binary %s version %u was written by an older vps (this build reads version %d): "
				"have that vps write it as YAML (--yaml), which this one reads",
				r->name, vps_doc_kind_name(dkind), version, binary_version(dkind));
	if (flags != 0)
		return vps_fail(VPS_EFORMAT, "%s: unknown header flags 0x%08x", r->name, flags);
	if (d[12] || d[13] || d[14] || d[15])
		return vps_fail(VPS_EFORMAT, "%s: corrupt header: reserved bytes are not zero", r->name);
	const unsigned char *frame = d + VPS_DOC_HEADER_SIZE;
	size_t flen = len - VPS_DOC_HEADER_SIZE;
	/* Frame_Header_Descriptor (RFC 8878 3.1.1.1.1): bit 2 is the
	 * content checksum flag */
	if (flen < 5 || memcmp(frame, "\x28\xb5\x2f\xfd", 4) != 0)
		return vps_fail(VPS_EFORMAT, "%s: truncated or corrupt zstd frame header", r->name);
	if (!(frame[4] & 0x04))
		return vps_fail(VPS_EFORMAT, "%s: zstd frame has no content checksum", r->name);
	unsigned long long content = ZSTD_getFrameContentSize(frame, flen);
	if (content == ZSTD_CONTENTSIZE_ERROR)
		return vps_fail(VPS_EFORMAT, "%s: truncated or corrupt zstd frame header", r->name);
	if (content == ZSTD_CONTENTSIZE_UNKNOWN || content > VPS_DOC_MAX_BYTES)
		return vps_fail(VPS_EFORMAT, "%s: zstd frame content size missing or too large", r->name);
	size_t csize = ZSTD_findFrameCompressedSize(frame, flen);
	if (ZSTD_isError(csize))
		return vps_fail(VPS_EFORMAT, "%s: truncated zstd frame", r->name);
	if (csize != flen)
		return vps_fail(VPS_EFORMAT, "%s: %zu unexpected bytes after the document", r->name, flen - csize);
	/* a zstd block of at most 128 KiB takes at least 4 bytes (RFC 8878
	 * 3.1.1.2): a claim beyond that ratio is a lie, refused before the
	 * allocation it asks for */
	if (content / (128 << 10) > csize / 4)
		return vps_fail(VPS_EFORMAT, "%s: zstd frame claims %llu bytes, more than its %zu bytes can hold", r->name,
				content, csize);
	r->plen = (size_t)content;
	r->wcap = vps_min64((int64_t)r->plen, (int64_t)WINDOW_BYTES);
	r->payload = malloc(r->wcap ? r->wcap : 1);
	r->dctx = ZSTD_createDCtx();
	if (!r->payload || !r->dctx)
		return vps_fail(VPS_ENOMEM, "%s: out of memory to read the document", r->name);
	/* the frame stays where the caller keeps it (data outlives the reader) */
	r->zin = (ZSTD_inBuffer){frame, flen, 0};
	return VPS_OK;
}

static vps_result_t yaml_parse_error(const char *name, const yaml_parser_t *p)
{
	if (p->error == YAML_MEMORY_ERROR)
		return VPS_NOMEM();
	return vps_fail(VPS_EINPUT, "%s: line %zu: %s %s", name,
			(p->problem_mark.line ? p->problem_mark.line : p->context_mark.line) + 1,
			p->problem ? p->problem : "YAML error", p->context ? p->context : "");
}

/* One pass over the first document's events before libyaml builds its tree,
 * stopping at the first violation so that the time spent is linear in the
 * input: nesting is bounded (see VPS_DOC_MAX_DEPTH), and anchors and aliases
 * are refused. vps never writes them, and an alias lets a few bytes stand
 * for a subtree read again at every reference (a billion laughs); libyaml
 * also looks anchors up by a linear scan, quadratic in their number. */
static vps_result_t yaml_precheck(const char *name, const void *data, size_t len)
{
	yaml_parser_t p;
	if (!yaml_parser_initialize(&p))
		return VPS_NOMEM();
	yaml_parser_set_input_string(&p, data, len);
	vps_result_t rc = VPS_OK;
	int depth = 0;
	for (bool done = false; !done && !rc;) {
		yaml_event_t ev;
		if (!yaml_parser_parse(&p, &ev)) {
			rc = yaml_parse_error(name, &p);
			break;
		}
		size_t line = ev.start_mark.line + 1;
		const yaml_char_t *anchor = NULL;
		switch (ev.type) {
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			anchor = ev.type == YAML_SEQUENCE_START_EVENT ? ev.data.sequence_start.anchor
								       : ev.data.mapping_start.anchor;
			if (++depth > VPS_DOC_MAX_DEPTH)
				rc = vps_fail(VPS_EINPUT, "%s: line %zu: nested deeper than %d levels", name, line,
					      VPS_DOC_MAX_DEPTH);
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			depth--;
			break;
		case YAML_SCALAR_EVENT:
			anchor = ev.data.scalar.anchor;
			break;
		case YAML_ALIAS_EVENT:
			rc = vps_fail(VPS_EINPUT, "%s: line %zu: YAML aliases (*%s) are not supported", name, line,
				      (const char *)ev.data.alias.anchor);
			break;
		case YAML_DOCUMENT_END_EVENT: /* yaml_parser_load reads only the first */
		case YAML_STREAM_END_EVENT:
			done = true;
			break;
		default:
			break;
		}
		if (anchor && !rc)
			rc = vps_fail(VPS_EINPUT, "%s: line %zu: YAML anchors (&%s) are not supported", name, line,
				      (const char *)anchor);
		yaml_event_delete(&ev);
	}
	yaml_parser_delete(&p);
	return rc;
}

vps_result_t vps_reader_new(struct vps_reader **rp, const char *name, const void *data, size_t len,
			    enum vps_doc_kind kind)
{
	vps_result_t rc;
	struct vps_reader *r = vps_calloc(1, sizeof(*r));
	if (!r)
		return VPS_ENOMEM;
	r->name = vps_strdup(name);
	if (!r->name) {
		free(r);
		return VPS_ENOMEM;
	}
	if (len == 0) {
		rc = vps_fail(VPS_EINPUT, "%s: empty input", name);
		goto fail;
	}
	if (vps_is_binary(data, len)) {
		r->binary = true;
		VPS_CHECK_GOTO(open_binary(r, data, len, kind), rc, fail);
		*rp = r;
		return VPS_OK;
	}
	if (len >= 4 && memcmp(data, "\x89VP", 3) == 0) {
		rc = vps_fail(VPS_EFORMAT, "%s: wrong magic: not a vps binary document", name);
		goto fail;
	}
	if (memchr(data, '\0', len)) {
		rc = vps_fail(VPS_EFORMAT, "%s: wrong magic: neither YAML nor a vps binary document", name);
		goto fail;
	}
	VPS_CHECK_GOTO(yaml_precheck(name, data, len), rc, fail);
	yaml_parser_t parser;
	if (!yaml_parser_initialize(&parser)) {
		rc = VPS_NOMEM();
		goto fail;
	}
	yaml_parser_set_input_string(&parser, data, len);
	if (!yaml_parser_load(&parser, &r->doc)) {
		rc = yaml_parse_error(name, &parser);
		yaml_parser_delete(&parser);
		goto fail;
	}
	yaml_parser_delete(&parser);
	r->doc_ready = true;
	yaml_node_t *root = yaml_document_get_root_node(&r->doc);
	if (!root || root->type != YAML_MAPPING_NODE) {
		rc = vps_fail(VPS_EINPUT, "%s: line 1: expected a mapping at the top of the document", name);
		goto fail;
	}
	VPS_CHECK_GOTO(push_frame(r, 1), rc, fail);
	if (kind)
		VPS_CHECK_GOTO(check_header(r, kind), rc, fail);
	*rp = r;
	return VPS_OK;
fail:
	vps_reader_free(r);
	return rc;
}

void vps_reader_free(struct vps_reader *r)
{
	if (!r)
		return;
	while (r->nframes)
		pop_frame(r);
	free(r->frames);
	if (r->doc_ready)
		yaml_document_delete(&r->doc);
	str_set_free(&r->strs);
	ZSTD_freeDCtx(r->dctx);
	free(r->payload);
	free(r->name);
	free(r);
}

static vps_result_t map_end(struct vps_reader *r, bool strict);

vps_result_t vps_reader_finish(struct vps_reader *r)
{
	if (r->binary) {
		if (r->pos != r->plen)
			return vps_fail(VPS_EFORMAT, "%s: %zu unread bytes at the end of the document", r->name,
					r->plen - r->pos);
		/* the frame's end: its checksum, and no byte past the size it states */
		while (!r->zdone) {
			unsigned char extra[64];
			ZSTD_outBuffer out = {extra, sizeof(extra), 0};
			size_t before = r->zin.pos, ret = ZSTD_decompressStream(r->dctx, &out, &r->zin);
			if (ZSTD_isError(ret))
				return vps_fail(VPS_EFORMAT, "%s: corrupt document: %s", r->name, ZSTD_getErrorName(ret));
			if (out.pos)
				return vps_fail(VPS_EFORMAT, "%s: corrupt document: size mismatch", r->name);
			if (!ret)
				r->zdone = true;
			else if (r->zin.pos == before)
				return vps_fail(VPS_EFORMAT, "%s: corrupt document: truncated frame", r->name);
		}
		return VPS_OK;
	}
	/* the top mapping: the echo's writer ends its own in vps_writer_finish */
	return map_end(r, true);
}

bool vps_r_has(struct vps_reader *r, const char *key)
{
	if (r->binary)
		return false;
	return lookup(r, key, false) != 0;
}

vps_result_t vps_r_map_begin(struct vps_reader *r, const char *key)
{
	if (!r->binary) {
		int id;
		VPS_CHECK(need_node(r, key, &id));
		if (node_at(r, id)->type != YAML_MAPPING_NODE)
			return vps_fail(VPS_EINPUT, "%s: line %d: %s%sexpected a mapping", r->name, node_line(r, id),
					key ? key : "", key ? ": " : "");
		VPS_CHECK(push_frame(r, id));
	}
	return r->echo ? vps_w_map_begin(r->echo, key) : VPS_OK;
}

static vps_result_t map_end(struct vps_reader *r, bool strict)
{
	if (r->binary)
		return VPS_OK;
	struct frame *f = top(r);
	if (strict && !f->is_seq) {
		yaml_node_pair_t *pairs = node_at(r, f->node)->data.mapping.pairs.start;
		for (size_t i = 0; i < f->npairs; i++) {
			if (!f->used[i]) {
				yaml_node_t *k = node_at(r, pairs[i].key);
				const char *ks = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "?";
				return vps_fail(VPS_EINPUT, "%s: line %d: unknown key '%s'", r->name,
						(int)k->start_mark.line + 1, ks);
			}
		}
	}
	pop_frame(r);
	return VPS_OK;
}

vps_result_t vps_r_map_end(struct vps_reader *r)
{
	VPS_CHECK(map_end(r, true));
	return r->echo ? vps_w_map_end(r->echo) : VPS_OK;
}

vps_result_t vps_r_map_end_lenient(struct vps_reader *r)
{
	VPS_CHECK(map_end(r, false));
	return r->echo ? vps_w_map_end(r->echo) : VPS_OK;
}

/* style: -1 as its items make it (vps_w_seq_begin_auto), else flow or not */
static vps_result_t seq_begin(struct vps_reader *r, const char *key, uint64_t *n, int style)
{
	if (r->binary) {
		VPS_CHECK(bin_u64_read(r, n));
		/* every item takes at least one byte: a larger count is corruption */
		if (*n > r->plen - r->pos)
			return vps_fail(VPS_EFORMAT, "%s: corrupt sequence length %" PRIu64, r->name, *n);
	} else {
		int id;
		VPS_CHECK(need_node(r, key, &id));
		yaml_node_t *node = node_at(r, id);
		if (node->type != YAML_SEQUENCE_NODE)
			return vps_fail(VPS_EINPUT, "%s: line %d: %s%sexpected a sequence", r->name, node_line(r, id),
					key ? key : "", key ? ": " : "");
		*n = (uint64_t)(node->data.sequence.items.top - node->data.sequence.items.start);
		VPS_CHECK(push_frame(r, id));
	}
	if (!r->echo)
		return VPS_OK;
	return style < 0 ? vps_w_seq_begin_auto(r->echo, key, *n) : vps_w_seq_begin(r->echo, key, *n, style);
}

vps_result_t vps_r_seq_begin(struct vps_reader *r, const char *key, uint64_t *n) { return seq_begin(r, key, n, -1); }

vps_result_t vps_r_seq_begin_flow(struct vps_reader *r, const char *key, uint64_t *n, bool flow)
{
	return seq_begin(r, key, n, flow);
}

vps_result_t vps_r_seq_end(struct vps_reader *r)
{
	if (!r->binary) {
		struct frame *f = top(r);
		yaml_node_t *n = node_at(r, f->node);
		size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
		if (f->next < count)
			return vps_fail(VPS_EINPUT, "%s: line %d: unexpected extra item in sequence", r->name,
					node_line(r, n->data.sequence.items.start[f->next]));
		pop_frame(r);
	}
	return r->echo ? vps_w_seq_end(r->echo) : VPS_OK;
}

static vps_result_t yaml_scalar(struct vps_reader *r, const char *key, const char **s, int *id)
{
	VPS_CHECK(need_node(r, key, id));
	return scalar_of(r, key, *id, s);
}

static vps_result_t bad_value(struct vps_reader *r, const char *key, int id, const char *what,
			      const char *s)
{
	return vps_fail(VPS_EINPUT, "%s: line %d: %s%s'%s' is not %s", r->name, node_line(r, id),
			key ? key : "", key ? ": " : "", s, what);
}

vps_result_t vps_r_int(struct vps_reader *r, const char *key, int64_t *v, int64_t min, int64_t max)
{
	int64_t x;
	int id = 0;
	if (r->binary) {
		uint64_t u;
		VPS_CHECK(bin_u64_read(r, &u));
		x = (int64_t)u;
	} else {
		const char *s;
		char *end;
		VPS_CHECK(yaml_scalar(r, key, &s, &id));
		errno = 0;
		x = strtoll(s, &end, 10);
		if (!*s || *end || errno)
			return bad_value(r, key, id, "an integer", s);
	}
	if (x < min || x > max) {
		if (r->binary)
			return vps_fail(VPS_EFORMAT, "%s: %s: value %" PRId64 " out of range [%" PRId64 ", %" PRId64 "]",
					r->name, key ? key : "item", x, min, max);
		return vps_fail(VPS_EINPUT, "%s: line %d: %s%s%" PRId64 " is out of range [%" PRId64 ", %" PRId64 "]",
				r->name, node_line(r, id), key ? key : "", key ? ": " : "", x, min, max);
	}
	*v = x;
	return r->echo ? vps_w_int(r->echo, key, x) : VPS_OK;
}

vps_result_t vps_r_u64hex(struct vps_reader *r, const char *key, uint64_t *v)
{
	if (r->binary) {
		VPS_CHECK(bin_u64_read(r, v));
	} else {
		const char *s;
		char *end;
		int id;
		VPS_CHECK(yaml_scalar(r, key, &s, &id));
		errno = 0;
		*v = strtoull(s, &end, 0);
		if (!*s || *end || errno)
			return bad_value(r, key, id, "a hexadecimal number", s);
	}
	return r->echo ? vps_w_u64hex(r->echo, key, *v) : VPS_OK;
}

vps_result_t vps_r_double(struct vps_reader *r, const char *key, double *v)
{
	if (r->binary) {
		uint64_t bits;
		VPS_CHECK(bin_u64_read(r, &bits));
		memcpy(v, &bits, 8);
		/* what the YAML encoding cannot carry, nor a reader of it take */
		if (!isfinite(*v))
			return vps_fail(VPS_EFORMAT, "%s: %s: corrupt number (not finite)", r->name, key ? key : "item");
	} else {
		const char *s;
		char *end;
		int id;
		VPS_CHECK(yaml_scalar(r, key, &s, &id));
		errno = 0;
		*v = strtod(s, &end);
		if (!*s || *end || errno || !isfinite(*v))
			return bad_value(r, key, id, "a number", s);
	}
	return r->echo ? vps_w_double(r->echo, key, *v) : VPS_OK;
}

vps_result_t vps_r_bool(struct vps_reader *r, const char *key, bool *v)
{
	if (r->binary) {
		VPS_CHECK(bin_need(r, 1));
		unsigned char b = *AT(r);
		r->pos++;
		if (b > 1)
			return vps_fail(VPS_EFORMAT, "%s: corrupt boolean", r->name);
		*v = b;
	} else {
		const char *s;
		int id;
		VPS_CHECK(yaml_scalar(r, key, &s, &id));
		if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "yes") || !strcmp(s, "1"))
			*v = true;
		else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "no") || !strcmp(s, "0"))
			*v = false;
		else
			return bad_value(r, key, id, "a boolean (true or false)", s);
	}
	return r->echo ? vps_w_bool(r->echo, key, *v) : VPS_OK;
}

/* Whether n bytes are UTF-8 without NUL: what a YAML scalar can carry and
 * a C string holds whole. */
static bool utf8_text(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned c = p[i];
		size_t k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 4;
		if (c == 0 || k == 4 || (k && n - i - 1 < k))
			return false;
		uint32_t cp = k ? c & (0x3fu >> k) : c;
		for (size_t j = 1; j <= k; j++) {
			if ((p[i + j] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (p[i + j] & 0x3fu);
		}
		/* overlong forms, surrogates, beyond U+10FFFF */
		if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
		    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
			return false;
		i += k + 1;
	}
	return true;
}

vps_result_t vps_r_str(struct vps_reader *r, const char *key, const char **s)
{
	if (r->binary) {
		VPS_CHECK(bin_need(r, 4));
		const unsigned char *p = AT(r);
		size_t n = p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
		r->pos += 4;
		VPS_CHECK(bin_need(r, n));
		/* the YAML encoding could not carry it, nor a C string */
		if (!utf8_text(AT(r), n))
			return vps_fail(VPS_EFORMAT, "%s: %s: corrupt string (not UTF-8 text)", r->name,
					key ? key : "item");
		const char *c = str_set_add(&r->strs, AT(r), n);
		if (!c)
			return VPS_NOMEM();
		r->pos += n;
		*s = c;
	} else {
		int id;
		VPS_CHECK(yaml_scalar(r, key, s, &id));
	}
	return r->echo ? vps_w_str(r->echo, key, *s) : VPS_OK;
}

vps_result_t vps_r_int_opt(struct vps_reader *r, const char *key, int64_t *v, int64_t min,
			   int64_t max, int64_t def)
{
	if (!r->binary && !vps_r_has(r, key)) {
		*v = def;
		/* the binary encoding has every field: the default is written */
		return r->echo ? vps_w_int(r->echo, key, def) : VPS_OK;
	}
	return vps_r_int(r, key, v, min, max);
}

vps_result_t vps_r_bool_opt(struct vps_reader *r, const char *key, bool *v, bool def)
{
	if (!r->binary && !vps_r_has(r, key)) {
		*v = def;
		return r->echo ? vps_w_bool(r->echo, key, def) : VPS_OK;
	}
	return vps_r_bool(r, key, v);
}

vps_result_t vps_w_int_sparse(struct vps_writer *w, const char *key, int64_t v, int64_t def)
{
	return v != def || !vps_writer_is_yaml(w) ? vps_w_int(w, key, v) : VPS_OK;
}

vps_result_t vps_w_bool_sparse(struct vps_writer *w, const char *key, bool v, bool def)
{
	return v != def || !vps_writer_is_yaml(w) ? vps_w_bool(w, key, v) : VPS_OK;
}

vps_result_t vps_r_int_sparse(struct vps_reader *r, const char *key, int64_t *v, int64_t min, int64_t max,
			      int64_t def)
{
	struct vps_writer *echo = r->echo;
	r->echo = NULL;
	vps_result_t rc = vps_r_int_opt(r, key, v, min, max, def);
	r->echo = echo;
	return !rc && echo ? vps_w_int_sparse(echo, key, *v, def) : rc;
}

vps_result_t vps_r_bool_sparse(struct vps_reader *r, const char *key, bool *v, bool def)
{
	struct vps_writer *echo = r->echo;
	r->echo = NULL;
	vps_result_t rc = vps_r_bool_opt(r, key, v, def);
	r->echo = echo;
	return !rc && echo ? vps_w_bool_sparse(echo, key, *v, def) : rc;
}

vps_result_t vps_r_str_opt(struct vps_reader *r, const char *key, const char **s, const char *def)
{
	if (!r->binary && !vps_r_has(r, key)) {
		*s = def;
		return r->echo ? vps_w_str(r->echo, key, def) : VPS_OK;
	}
	return vps_r_str(r, key, s);
}

/* ======================================================================
 * Files
 * ==================================================================== */

bool vps_is_binary(const void *data, size_t len)
{
	return len >= 4 && memcmp(data, VPS_DOC_MAGIC, 4) == 0;
}

enum vps_doc_kind vps_doc_sniff(const void *data, size_t len)
{
	const unsigned char *d = data;
	if (vps_is_binary(data, len))
		return len >= 6 ? (enum vps_doc_kind)(d[4] | d[5] << 8) : 0;
	/* The writer puts `vps: KIND` first; people may not, so scan the first
	 * lines for it (or for "vps": "KIND" in JSON). */
	size_t lim = len < 4096 ? len : 4096;
	for (size_t i = 0; i + 6 < lim; i++) {
		if (memcmp(d + i, "\"vps\"", 5) != 0)
			continue;
		size_t j = i + 5;
		while (j < lim && (d[j] == ' ' || d[j] == ':' || d[j] == '\t'))
			j++;
		if (j < lim && d[j] == '"') {
			char name[32] = {0};
			size_t k = 0;
			for (j++; j < lim && k < sizeof(name) - 1 && d[j] != '"'; j++)
				name[k++] = (char)d[j];
			return kind_from_name(name);
		}
	}
	for (size_t i = 0; i + 5 < lim; i++) {
		if ((i == 0 || d[i - 1] == '\n') && memcmp(d + i, "vps:", 4) == 0) {
			size_t j = i + 4;
			while (j < lim && d[j] == ' ')
				j++;
			char name[32] = {0};
			size_t k = 0;
			while (j < lim && k < sizeof(name) - 1 && d[j] != '\n' && d[j] != ' ' && d[j] != '\r')
				name[k++] = (char)d[j++];
			return kind_from_name(name);
		}
	}
	return 0;
}

vps_result_t vps_read_file(const char *path, struct vps_bytes *out)
{
	int fd = 0;
	bool is_stdin = !path || strcmp(path, "-") == 0;
	memset(out, 0, sizeof(*out));
	if (!is_stdin) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return vps_fail(VPS_EINPUT, "%s: %s", path, strerror(errno));
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
			close(fd);
			return vps_fail(VPS_EINPUT, "%s: is a directory", path);
		}
	}
	for (;;) {
		if (out->cap - out->len < 65536) {
			vps_result_t rc = VPS_GROW(out->data, out->cap, out->cap + 65536);
			if (rc) {
				if (!is_stdin)
					close(fd);
				vps_bytes_release(out);
				return rc;
			}
		}
		ssize_t n = read(fd, out->data + out->len, out->cap - out->len);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0) {
			int e = errno;
			if (!is_stdin)
				close(fd);
			vps_bytes_release(out);
			return vps_fail(VPS_EINPUT, "%s: %s", is_stdin ? "<stdin>" : path, strerror(e));
		}
		if (n == 0)
			break;
		out->len += (size_t)n;
	}
	if (!is_stdin)
		close(fd);
	return VPS_OK;
}

static vps_result_t write_all(int fd, const unsigned char *p, size_t n, const char *what)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (w < 0)
			return vps_fail_errno("%s: write failed", what);
		p += w;
		n -= (size_t)w;
	}
	return VPS_OK;
}

/* The file that path names, through symbolic links in its last component
 * (the kernel follows those in its directories): *out is that path, *exists
 * whether it is there, st what it is. */
static vps_result_t resolve_output(const char *path, char **out, struct stat *st, bool *exists)
{
	char *cur = vps_strdup(path);
	if (!cur)
		return VPS_ENOMEM;
	for (int hops = 0;; hops++) {
		if (lstat(cur, st) != 0) {
			if (errno == ENOENT) {
				*exists = false;
				*out = cur;
				return VPS_OK;
			}
			vps_result_t rc = vps_fail_errno("%s", path);
			free(cur);
			return rc;
		}
		if (!S_ISLNK(st->st_mode)) {
			*exists = true;
			*out = cur;
			return VPS_OK;
		}
		char link[4096];
		ssize_t n = hops < 40 ? readlink(cur, link, sizeof(link)) : -1;
		if (n < 0 || (size_t)n >= sizeof(link)) {
			vps_result_t rc = hops >= 40 ? vps_fail(VPS_EINPUT, "%s: too many levels of symbolic links", path)
				: n < 0 ? vps_fail_errno("%s: read the link %s", path, cur)
					: vps_fail(VPS_EINPUT, "%s: the link %s is too long", path, cur);
			free(cur);
			return rc;
		}
		/* a relative target is relative to the link's directory */
		const char *slash = link[0] == '/' ? NULL : strrchr(cur, '/');
		size_t dir = slash ? (size_t)(slash - cur) + 1 : 0;
		char *next = vps_malloc(dir + (size_t)n + 1);
		if (!next) {
			free(cur);
			return VPS_ENOMEM;
		}
		memcpy(next, cur, dir);
		memcpy(next + dir, link, (size_t)n);
		next[dir + (size_t)n] = '\0';
		free(cur);
		cur = next;
	}
}

/* A character device or a FIFO is written to where it is: renaming a new
 * file over it would replace the device (as root, -o /dev/null would turn
 * the system's /dev/null into a regular file) or the FIFO its reader waits
 * on. */
static vps_result_t write_in_place(const char *path, const struct vps_bytes *b, bool binary)
{
	int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return vps_fail_errno("%s: open", path);
	struct stat st;
	vps_result_t rc = VPS_OK;
	if (fstat(fd, &st) != 0)
		rc = vps_fail_errno("%s", path);
	else if (!S_ISCHR(st.st_mode) && !S_ISFIFO(st.st_mode))
		rc = vps_fail(VPS_EINPUT, "%s: changed while it was opened; nothing written", path);
	else if (binary && isatty(fd))
		rc = vps_fail(VPS_EINPUT, "%s: refusing to write binary output to a terminal (use --yaml)", path);
	if (!rc)
		rc = write_all(fd, b->data, b->len, path);
	if (close(fd) != 0 && !rc)
		rc = vps_fail_errno("%s: close", path);
	return rc;
}

/* A regular file, or none, is replaced whole: a temporary beside it, renamed
 * over it once complete, so that a failed write leaves the old one. */
static vps_result_t write_replace(const char *path, const char *target, const struct vps_bytes *b,
				  const struct stat *old, bool exists)
{
	size_t n = strlen(target);
	char *tmp = vps_malloc(n + 16);
	if (!tmp)
		return VPS_ENOMEM;
	snprintf(tmp, n + 16, "%s.tmpXXXXXX", target);
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		vps_result_t rc = vps_fail_errno("%s: cannot create temporary file", path);
		free(tmp);
		return rc;
	}
	vps_result_t rc = write_all(fd, b->data, b->len, path);
	/* a file replaced keeps its permissions; a new one is 0644 */
	if (!rc && fchmod(fd, exists ? old->st_mode & 07777 : 0644) != 0)
		rc = vps_fail_errno("%s: chmod", tmp);
	if (!rc && fsync(fd) != 0)
		rc = vps_fail_errno("%s: fsync", path);
	if (close(fd) != 0 && !rc)
		rc = vps_fail_errno("%s: close", path);
	/* what was a regular file (or nothing) when looked at must still be:
	 * never rename over a device or a FIFO put there since */
	struct stat now;
	if (!rc && lstat(target, &now) == 0 && !S_ISREG(now.st_mode))
		rc = vps_fail(VPS_EINPUT, "%s: changed while it was written; nothing replaced", path);
	if (!rc && rename(tmp, target) != 0)
		rc = vps_fail_errno("%s: rename", path);
	if (rc)
		unlink(tmp);
	free(tmp);
	return rc;
}

static vps_result_t not_writable(const char *path, const struct stat *st)
{
	return vps_fail(VPS_EINPUT, "%s: is %s; vps writes a regular file, a character device or a FIFO", path,
			S_ISDIR(st->st_mode) ? "a directory" : S_ISBLK(st->st_mode) ? "a block device"
				: S_ISSOCK(st->st_mode) ? "a socket" : "not a file");
}

vps_result_t vps_write_output(const char *path, const struct vps_bytes *b, bool binary)
{
	if (!path || strcmp(path, "-") == 0) {
		if (binary && isatty(STDOUT_FILENO))
			return vps_fail(VPS_EINPUT,
					"refusing to write binary output to a terminal (use --yaml or -o FILE)");
		return write_all(STDOUT_FILENO, b->data, b->len, "<stdout>");
	}
	if (!*path)
		return vps_fail(VPS_EINPUT, "an empty output file name");
	/* what path ends at, through every link (/dev/stdout included) */
	struct stat st;
	if (stat(path, &st) == 0) {
		if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))
			return write_in_place(path, b, binary);
		if (!S_ISREG(st.st_mode))
			return not_writable(path, &st);
	}
	/* a regular file or none: the rename must replace the link's target,
	 * not the link */
	char *target;
	bool exists;
	VPS_CHECK(resolve_output(path, &target, &st, &exists));
	vps_result_t rc = exists && !S_ISREG(st.st_mode) ? not_writable(path, &st)
							 : write_replace(path, target, b, &st, exists);
	free(target);
	return rc;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n > k && !strcmp(s + n - k, suffix);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The NAMEs of the NAME.yaml files in the directories of search_path,
 * sorted, each once, as "a, b, c" in out ("" when there are none): what a
 * user who mistyped a name can give instead. At most KNOWN_MAX are read;
 * a list that does not fit in out ends with "...". */
#define KNOWN_MAX 512
static void known_names(const char *search_path, char *out, size_t n)
{
	char *names[KNOWN_MAX];
	size_t count = 0;
	bool more = false;
	out[0] = '\0';
	for (const char *s = search_path ? search_path : ""; *s;) {
		const char *colon = strchr(s, ':');
		size_t dl = colon ? (size_t)(colon - s) : strlen(s);
		char dir[4096];
		DIR *d = NULL;
		if (dl && dl < sizeof(dir)) {
			memcpy(dir, s, dl);
			dir[dl] = '\0';
			d = opendir(dir);
		}
		for (struct dirent *e; d && (e = readdir(d));) {
			size_t len = strlen(e->d_name);
			if (e->d_name[0] == '.' || !ends_with(e->d_name, ".yaml"))
				continue;
			if (count == KNOWN_MAX) {
				more = true;
				break;
			}
			char *name = strndup(e->d_name, len - strlen(".yaml"));
			if (!name) {
				more = true;
				break;
			}
			names[count++] = name;
		}
		if (d)
			closedir(d);
		s = colon ? colon + 1 : s + dl;
	}
	qsort(names, count, sizeof(*names), cmp_name);
	size_t used = 0;
	for (size_t i = 0; i < count; i++) {
		if (i && !strcmp(names[i], names[i - 1]))
			continue;
		/* room for this name, its separator and a closing "..." */
		size_t need = strlen(names[i]) + 2;
		if (used + need + 4 >= n) {
			more = true;
			break;
		}
		used += (size_t)snprintf(out + used, n - used, "%s%s", used ? ", " : "", names[i]);
	}
	if (more && used + 4 < n)
		snprintf(out + used, n - used, "%s...", used ? ", " : "");
	for (size_t i = 0; i < count; i++)
		free(names[i]);
}

vps_result_t vps_config_find(const char *arg, const char *search_path, const char *flag, const char *what,
			     char *path, size_t n)
{
	if (strchr(arg, '/') || !strcmp(arg, "-") || ends_with(arg, ".yaml") || ends_with(arg, ".yml") ||
	    ends_with(arg, ".json")) {
		snprintf(path, n, "%s", arg);
		return VPS_OK;
	}
	for (const char *s = search_path ? search_path : ""; *s;) {
		const char *colon = strchr(s, ':');
		size_t dl = colon ? (size_t)(colon - s) : strlen(s);
		snprintf(path, n, "%.*s/%s.yaml", (int)dl, s, arg);
		if (dl && access(path, R_OK) == 0)
			return VPS_OK;
		s = colon ? colon + 1 : s + dl;
	}
	char known[1024];
	known_names(search_path, known, sizeof(known));
	/* vps_model_load takes Hugging Face directories too */
	const char *also = !strcmp(what, "model") ? "; or a model file, a Hugging Face config.json or its directory" : "";
	if (known[0])
		return vps_fail(VPS_EINPUT, "%s: no %s named '%s'; known: %s%s (looked for %s.yaml in %s)", flag, what,
				arg, known, also, arg, search_path);
	return vps_fail(VPS_EINPUT, "%s: no %s named '%s'%s (looked for %s.yaml in %s; none there)", flag, what, arg,
			also, arg, search_path && *search_path ? search_path : "no directory");
}
