/* The document reader (io/doc.h): YAML parsed whole by libyaml and read by
 * key, or the binary encoding decompressed as it is read, in the writer's
 * order; either can echo what it reads to a writer (vps-show converts). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <yaml.h>
#include <zstd.h>

#include "io/doc.h"
#include "io/doc_int.h"
#include "util/hash.h"
#include "util/internal.h"
#include "util/slots.h"

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
	size_t *len;       /* v[i]'s length */
	size_t n, cap, cap_len;
	struct vps_slots slots;
};

static uint64_t str_hash(const void *set, size_t i)
{
	const struct str_set *t = set;
	return vps_hash64(t->v[i], t->len[i], 0x5354);
}

static void str_set_free(struct str_set *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->v[i]);
	free(t->v);
	free(t->len);
	vps_slots_release(&t->slots);
	memset(t, 0, sizeof(*t));
}

/* The interned copy of the n bytes at p, hashed h, or NULL. */
static const char *str_set_find(const struct str_set *t, const unsigned char *p, size_t n, uint64_t h)
{
	if (!t->slots.mask)
		return NULL;
	for (size_t i = vps_slots_start(&t->slots, h); t->slots.slot[i]; i = vps_slots_next(&t->slots, i)) {
		uint32_t k = t->slots.slot[i];
		if (t->len[k - 1] == n && !memcmp(t->v[k - 1], p, n))
			return t->v[k - 1];
	}
	return NULL;
}

/* A new copy of the n bytes at p, hashed h, interned (NULL when out of
 * memory). */
static const char *str_set_add(struct str_set *t, const unsigned char *p, size_t n, uint64_t h)
{
	if (vps_slots_room(&t->slots, t->n, 256, str_hash, t, "strings"))
		return NULL;
	if (vps_grow((void **)&t->v, &t->cap, t->n + 1, sizeof(*t->v)) ||
	    vps_grow((void **)&t->len, &t->cap_len, t->n + 1, sizeof(*t->len)))
		return NULL;
	char *c = malloc(n + 1);
	if (!c)
		return NULL;
	memcpy(c, p, n);
	c[n] = '\0';
	size_t i = vps_slots_start(&t->slots, h);
	while (t->slots.slot[i])
		i = vps_slots_next(&t->slots, i);
	t->slots.slot[i] = (uint32_t)t->n + 1;
	t->len[t->n] = n;
	t->v[t->n++] = c;
	return c;
}

struct vps_reader {
	char *name;
	bool binary;
	enum vps_doc_kind kind;
	unsigned version; /* binary: the header's */
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

bool vps_reader_has(const struct vps_reader *r, enum vps_doc_feature f)
{
	return !r->binary || (int)r->version >= vps_doc_feature_since(r->kind, f);
}
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

static inline vps_result_t bin_u64_read(struct vps_reader *r, uint64_t *v)
{
	/* in the window, it is in the payload */
	if (r->pos - r->wbase + 8 > r->wlen)
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
	enum vps_doc_kind found = vps_doc_kind_from_name(s);
	if (!found)
		return vps_r_error(r, "vps", "expected a %s document, found '%s'", vps_doc_kind_name(kind), s);
	if (found != kind) {
		char where[4096];
		snprintf(where, sizeof(where), "%s: line %d", r->name, vps_r_line(r, "vps"));
		return vps_doc_kind_fail(VPS_EINPUT, where, found, VPS_DOC_BIT(kind));
	}
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
		return vps_doc_kind_fail(VPS_EFORMAT, r->name, (enum vps_doc_kind)dkind, VPS_DOC_BIT(kind));
	if (version == 0)
		return vps_fail(VPS_EFORMAT, "%s: corrupt header: version 0", r->name);
	if ((int)version > vps_doc_binary_version(dkind))
		return vps_fail(VPS_EFORMAT, "%s: binary %s version %u is newer than this build reads (%d)", r->name,
				vps_doc_kind_name(dkind), version, vps_doc_binary_version(dkind));
	if ((int)version < vps_doc_binary_min(dkind)) {
		char reads[32];
		int lo = vps_doc_binary_min(dkind), hi = vps_doc_binary_version(dkind);
		if (lo == hi)
			snprintf(reads, sizeof(reads), "version %d", hi);
		else
			snprintf(reads, sizeof(reads), "versions %d to %d", lo, hi);
		return vps_fail(VPS_EFORMAT,
				"%s: binary %s version %u was written by an older vps (this build reads %s): "
				"have that vps write it as YAML (--yaml), which this one reads",
				r->name, vps_doc_kind_name(dkind), version, reads);
	}
	r->kind = (enum vps_doc_kind)dkind;
	r->version = version;
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
				/* lookup reads a key's first pair: a second is left unread */
				for (size_t j = 0; j < i && k->type == YAML_SCALAR_NODE; j++) {
					yaml_node_t *kj = node_at(r, pairs[j].key);
					if (kj->type == YAML_SCALAR_NODE && kj->data.scalar.length == k->data.scalar.length &&
					    !memcmp(kj->data.scalar.value, k->data.scalar.value, k->data.scalar.length))
						return vps_fail(VPS_EINPUT, "%s: line %d: key '%s' again (first at line %d)",
								r->name, (int)k->start_mark.line + 1, ks,
								(int)kj->start_mark.line + 1);
				}
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
		uint64_t h = vps_hash64(AT(r), n, 0x5354);
		/* a string seen before was checked then */
		const char *c = str_set_find(&r->strs, AT(r), n, h);
		/* the YAML encoding could not carry it, nor a C string */
		if (!c && !utf8_text(AT(r), n))
			return vps_fail(VPS_EFORMAT, "%s: %s: corrupt string (not UTF-8 text)", r->name,
					key ? key : "item");
		if (!c && !(c = str_set_add(&r->strs, AT(r), n, h)))
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

vps_result_t vps_r_str_sparse(struct vps_reader *r, const char *key, const char **s, const char *def)
{
	struct vps_writer *echo = r->echo;
	r->echo = NULL;
	vps_result_t rc = vps_r_str_opt(r, key, s, def);
	r->echo = echo;
	return !rc && echo ? vps_w_str_sparse(echo, key, *s, def) : rc;
}

vps_result_t vps_r_str_opt(struct vps_reader *r, const char *key, const char **s, const char *def)
{
	if (!r->binary && !vps_r_has(r, key)) {
		*s = def;
		return r->echo ? vps_w_str(r->echo, key, def) : VPS_OK;
	}
	return vps_r_str(r, key, s);
}
