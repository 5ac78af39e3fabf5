/* Documents (io/doc.h): the kinds, their versions, and telling a document's
 * kind from its first bytes. The writer is writer.c, the reader reader.c. */
#include "io/doc.h"
#include "io/doc_int.h"
#include "util/internal.h"

/* The YAML version counts changes a YAML reader cannot absorb (keys are
 * optional, so new keys with defaults do not count). The binary encoding
 * writes every field in order, so any new field changes it: 2 for the
 * fields of November 2026 (cp, grouped_gemm, the DeepSeek-V3 model keys;
 * a report's digest_seconds, requested_at, started_at, done_at, release_seconds,
 * opened_in_pause and connections); 3 for a plan's relay (and the staged
 * plan that holds one); then one more for a parallel map's family,
 * dp_replicate and dp_shard and its optimizer's keys (layout and parallel
 * 3, plan and staged plan 4); plan and staged plan 5 for a plan's relay
 * mode and the bandwidths VPS_RELAY_AUTO weighed; then one more for a
 * parallel map's offload and a rank view's buffers' host flag (layout and
 * parallel 4, plan and staged plan 6). binary_min is the oldest
 * binary version still read: what it lacks, its reader fills with the
 * defaults (vps_reader_has). Transitions name their configurations by spec
 * and have no binary encoding, so theirs stays. */
static const struct {
	enum vps_doc_kind kind;
	const char *name;
	int version, binary_version, binary_min;
	int since[VPS_NFEATURES]; /* the binary version each feature arrived in */
	/* what messages call one; what makes one, or how it is written; the
	 * tool that makes one (NULL: written by hand) */
	const char *noun, *made, *tool;
} doc_kinds[] = {
	{VPS_DOC_LAYOUT, "layout", 1, 4, 2, {3, 3, 0, 4}, "layout", "vps-layout --model MODEL --parallel SPEC -o FILE makes one",
	 "vps-layout"},
	{VPS_DOC_PLAN, "plan", 1, 6, 3, {4, 4, 5, 6}, "plan", "vps-plan A B -o FILE makes one, from layouts A and B",
	 "vps-plan"},
	{VPS_DOC_STAGED, "staged", 1, 6, 3, {4, 4, 5, 6}, "staged plan",
	 "vps-plan A B | vps-stage --budget SIZE - -o FILE makes one", "vps-stage"},
	{VPS_DOC_REPORT, "report", 1, 2, 2, {0}, "report", "vps-exec --report FILE writes one", "vps-exec"},
	{VPS_DOC_MODEL, "model", 1, 2, 2, {0}, "model",
	 "configs/models holds them; vps-formats(5) MODEL DOCUMENTS says how to write one", NULL},
	{VPS_DOC_DEVICES, "devices", 1, 1, 1, {0}, "devices document",
	 "vps-formats(5) DEVICES DOCUMENTS says how to write one", NULL},
	{VPS_DOC_TOPOLOGY, "topology", 1, 1, 1, {0}, "topology",
	 "configs/topologies holds them; vps-formats(5) TOPOLOGY DOCUMENTS says how to write one", NULL},
	{VPS_DOC_PARALLEL, "parallel", 1, 4, 2, {3, 3, 0, 4}, "parallel configuration",
	 "configs/parallel holds them; vps-formats(5) PARALLEL DOCUMENTS says how to write one", NULL},
	{VPS_DOC_BUDGETS, "budgets", 1, 1, 1, {0}, "budgets document",
	 "vps-formats(5) BUDGETS DOCUMENTS says how to write one", NULL},
	{VPS_DOC_TRANSITION, "transition", 1, 2, 2, {0}, "transition",
	 "vps-plan --transition list names those of configs/transitions; vps-formats(5) TRANSITION DOCUMENTS says "
	 "how to write one",
	 NULL},
};
#define NKINDS (sizeof(doc_kinds) / sizeof(doc_kinds[0]))

const char *vps_doc_kind_name(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].name;
	return "unknown";
}

int vps_doc_version(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].version;
	return 0;
}

int vps_doc_binary_version(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].binary_version;
	return 0;
}

int vps_doc_binary_min(enum vps_doc_kind kind)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].binary_min;
	return 0;
}

int vps_doc_feature_since(enum vps_doc_kind kind, enum vps_doc_feature f)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (doc_kinds[i].kind == kind)
			return doc_kinds[i].since[f];
	return 0;
}

enum vps_doc_kind vps_doc_kind_from_name(const char *s)
{
	for (size_t i = 0; i < NKINDS; i++)
		if (strcmp(doc_kinds[i].name, s) == 0)
			return doc_kinds[i].kind;
	return 0;
}

vps_result_t vps_doc_kind_fail(vps_result_t rc, const char *name, enum vps_doc_kind found, unsigned expected)
{
	char want[256] = "", tools[256] = "";
	const char *made = NULL, *found_noun = NULL;
	size_t nwant = 0, ntools = 0, len = 0, tlen = 0;
	for (size_t i = 0; i < NKINDS; i++) {
		if (doc_kinds[i].kind == found)
			found_noun = doc_kinds[i].noun;
		if (expected & VPS_DOC_BIT(doc_kinds[i].kind)) {
			nwant++;
			made = doc_kinds[i].made;
			ntools += doc_kinds[i].tool != NULL;
		}
	}
	/* "a layout, a plan or a staged plan", and the tools that make them */
	for (size_t i = 0, k = 0, t = 0; i < NKINDS; i++) {
		if (!(expected & VPS_DOC_BIT(doc_kinds[i].kind)))
			continue;
		k++;
		if (len < sizeof(want))
			len += (size_t)snprintf(want + len, sizeof(want) - len, "%sa %s", k == 1 ? "" : k == nwant ? " or " : ", ",
						doc_kinds[i].noun);
		if (doc_kinds[i].tool && tlen < sizeof(tools))
			t++, tlen += (size_t)snprintf(tools + tlen, sizeof(tools) - tlen, "%s%s",
						      t == 1 ? "" : t == ntools ? " and " : ", ", doc_kinds[i].tool);
	}
	char how[512];
	if (nwant == 1)
		snprintf(how, sizeof(how), " (%s)", made);
	else if (ntools)
		snprintf(how, sizeof(how), " (%s make%s them)", tools, ntools == 1 ? "s" : "");
	else
		how[0] = '\0';
	if (found_noun)
		return vps_fail(rc, "%s: a %s, not %s%s", name, found_noun, want, how);
	return vps_fail(rc, "%s: a vps document of kind %u, which this build does not know, not %s%s", name,
			(unsigned)found, want, how);
}

vps_result_t vps_doc_wrong_kind(const char *name, enum vps_doc_kind found, unsigned expected)
{
	return vps_doc_kind_fail(VPS_EINPUT, name, found, expected);
}

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
			return vps_doc_kind_from_name(name);
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
			return vps_doc_kind_from_name(name);
		}
	}
	return 0;
}
