#include <inttypes.h>
#include <stdio.h>

#include "io/doc.h"
#include "util/internal.h"
#include "model/dtensor.h"
#include "model/parallel_io.h"

void vps_parallel_init(struct vps_parallel *p)
{
	memset(p, 0, sizeof(*p));
	p->tp = p->pp = p->dp = p->cp = p->ep = p->vpp = 1;
	p->etp = 0;
	p->bucket = VPS_BUCKET_NONE;
	p->family = VPS_FAMILY_MEGATRON;
	p->dp_replicate = p->dp_shard = 1;
	p->optimizer = p->scalar_optimizer = VPS_OPT_ADAM;
}

static const char *family_names[] = {"megatron", "dtensor"};

const char *vps_parallel_family_name(int64_t family)
{
	return family == VPS_FAMILY_MEGATRON || family == VPS_FAMILY_DTENSOR ? family_names[family] : "?";
}

static vps_result_t family_parse(const char *s, int64_t *family)
{
	for (int64_t i = 0; i < 2; i++)
		if (!strcmp(s, family_names[i])) {
			*family = i;
			return VPS_OK;
		}
	return VPS_EINPUT;
}

static const char *optimizer_names[VPS_NOPTIMIZERS] = {"adam", "sgd", "muon", "lion"};

const char *vps_optimizer_name(int optimizer)
{
	return optimizer >= 0 && optimizer < VPS_NOPTIMIZERS ? optimizer_names[optimizer] : "?";
}

vps_result_t vps_optimizer_parse(const char *name, int *optimizer)
{
	for (int i = 0; i < VPS_NOPTIMIZERS; i++)
		if (!strcmp(name, optimizer_names[i])) {
			*optimizer = i;
			return VPS_OK;
		}
	return vps_fail(VPS_EINPUT, "unknown optimizer '%s' (adam, sgd, muon, lion)", name);
}

/* The optimizer's keys, as text (spec, YAML and binary alike). */
static vps_result_t set_optimizer_key(struct vps_parallel *p, const char *key, const char *val, bool *known)
{
	int v;
	*known = true;
	if (!strcmp(key, "optimizer") || !strcmp(key, "scalar")) {
		VPS_CHECK(vps_optimizer_parse(val, &v));
		*(!strcmp(key, "optimizer") ? &p->optimizer : &p->scalar_optimizer) = v;
	} else if (!strcmp(key, "exp_avg") || !strcmp(key, "exp_avg_sq")) {
		if (strcmp(val, "fp32") && strcmp(val, "bf16"))
			return vps_fail(VPS_EINPUT, "%s=%s: expected fp32 or bf16", key, val);
		*(!strcmp(key, "exp_avg") ? &p->exp_avg_bf16 : &p->exp_avg_sq_bf16) = val[0] == 'b';
	} else if (!strcmp(key, "offload")) {
		char *end;
		double f = strtod(val, &end);
		/* !(f <= 1) also refuses a NaN */
		if (!*val || *end || f < 0 || !(f <= 1))
			return vps_fail(VPS_EINPUT, "offload=%s: expected a fraction in [0, 1] (--optimizer-offload-fraction)",
					val);
		p->offload = f;
	} else if (!strcmp(key, "precision_aware")) {
		if (strcmp(val, "0") && strcmp(val, "1"))
			return vps_fail(VPS_EINPUT, "%s=%s: expected 0 or 1", key, val);
		p->precision_aware = val[0] == '1';
	} else {
		*known = false;
	}
	return VPS_OK;
}

struct pkey {
	const char *name;
	size_t off;
	int64_t min, max;
};

#define PK(f, lo, hi) {#f, offsetof(struct vps_parallel, f), lo, hi}
static const struct pkey pkeys[] = {
	PK(tp, 1, 1 << 20), PK(pp, 1, 1 << 20), PK(dp, 1, 1 << 24), PK(cp, 1, 1 << 20), PK(ep, 1, 1 << 20),
	PK(etp, 0, 1 << 20), PK(vpp, 1, 1 << 10), PK(zero, 0, 1), PK(first, 0, 1 << 20),
	PK(last, 0, 1 << 20),
};

/* The DTensor family's mesh: a key of its own selects the family */
static const struct pkey dkeys[] = {
	PK(dp_shard, 1, 1 << 24),
	{"fsdp", offsetof(struct vps_parallel, dp_shard), 1, 1 << 24},
	PK(dp_replicate, 1, 1 << 24),
};

static int64_t *pfield(struct vps_parallel *p, const struct pkey *k)
{
	return (int64_t *)((char *)p + k->off);
}

static const struct pkey *find_key(const struct pkey *keys, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (!strcmp(keys[i].name, name))
			return &keys[i];
	return NULL;
}

vps_result_t vps_parallel_parse(struct vps_parallel *p, const char *spec, const char *where)
{
	const char *s = spec, *w = where ? where : "", *sep = where ? ": " : "";
	if (!*s)
		return vps_fail(VPS_EINPUT, "%s%sempty parallel configuration", w, sep);
	while (*s) {
		const char *comma = strchr(s, ',');
		size_t len = comma ? (size_t)(comma - s) : strlen(s);
		char item[128];
		if (len >= sizeof(item) || len == 0)
			return vps_fail(VPS_EINPUT, "%s%sbad item in '%s'", w, sep, spec);
		memcpy(item, s, len);
		item[len] = '\0';
		char *eq = strchr(item, '=');
		if (!eq)
			return vps_fail(VPS_EINPUT, "%s%s'%s' is not KEY=VALUE", w, sep, item);
		*eq = '\0';
		const char *val = eq + 1;
		char *end;
		if (!strcmp(item, "bucket")) {
			if (!strcmp(val, "auto")) {
				p->bucket = VPS_BUCKET_AUTO;
			} else {
				long long v = strtoll(val, &end, 10);
				if (!*val || *end || v < 0)
					return vps_fail(VPS_EINPUT, "%s%sbucket=%s: expected 'auto' or a number of elements",
							w, sep, val);
				p->bucket = v;
			}
		} else if (!strcmp(item, "grad") || !strcmp(item, "grouped_gemm")) {
			if (strcmp(val, "0") && strcmp(val, "1"))
				return vps_fail(VPS_EINPUT, "%s%s%s=%s: expected 0 or 1", w, sep, item, val);
			bool *flag = !strcmp(item, "grad") ? &p->grad : &p->grouped_gemm;
			*flag = val[0] == '1';
		} else if (!strcmp(item, "family")) {
			if (family_parse(val, &p->family))
				return vps_fail(VPS_EINPUT, "%s%sfamily=%s: expected megatron or dtensor", w, sep, val);
		} else {
			bool known;
			if (set_optimizer_key(p, item, val, &known)) {
				char why[256];
				snprintf(why, sizeof(why), "%s", vps_last_error());
				return vps_fail(VPS_EINPUT, "%s%s%s", w, sep, why);
			}
			if (known) {
				s += len;
				if (*s == ',')
					s++;
				continue;
			}
			const struct pkey *k = find_key(pkeys, sizeof(pkeys) / sizeof(pkeys[0]), item);
			if (!k && (k = find_key(dkeys, sizeof(dkeys) / sizeof(dkeys[0]), item)))
				p->family = VPS_FAMILY_DTENSOR;
			if (!k)
				return vps_fail(VPS_EINPUT,
						"%s%sunknown key '%s' (tp, pp, dp, cp, ep, etp, vpp, zero, first, last, bucket, grad, "
						"grouped_gemm, optimizer, scalar, precision_aware, exp_avg, exp_avg_sq, offload; a DTensor "
						"mesh: dp_shard or fsdp, dp_replicate, family)",
						w, sep, item);
			long long v = strtoll(val, &end, 10);
			if (!*val || *end || v < k->min || v > k->max)
				return vps_fail(VPS_EINPUT, "%s%s%s=%s: expected an integer in [%" PRId64 ", %" PRId64 "]",
						w, sep, item, val, k->min, k->max);
			*pfield(p, k) = v;
		}
		s += len;
		if (*s == ',')
			s++;
	}
	return VPS_OK;
}

static vps_result_t write_family(struct vps_writer *w, const struct vps_parallel *p)
{
	VPS_CHECK(vps_w_str_sparse(w, "family", vps_parallel_family_name(p->family), "megatron"));
	VPS_CHECK(vps_w_int_sparse(w, "dp_replicate", p->dp_replicate, 1));
	return vps_w_int_sparse(w, "dp_shard", p->dp_shard, 1);
}

static vps_result_t write_optimizer(struct vps_writer *w, const struct vps_parallel *p)
{
	VPS_CHECK(vps_w_str_sparse(w, "optimizer", vps_optimizer_name(p->optimizer), "adam"));
	VPS_CHECK(vps_w_str_sparse(w, "scalar", vps_optimizer_name(p->scalar_optimizer), "adam"));
	VPS_CHECK(vps_w_str_sparse(w, "exp_avg", p->exp_avg_bf16 ? "bf16" : "fp32", "fp32"));
	VPS_CHECK(vps_w_str_sparse(w, "exp_avg_sq", p->exp_avg_sq_bf16 ? "bf16" : "fp32", "fp32"));
	VPS_CHECK(vps_w_bool_sparse(w, "precision_aware", p->precision_aware, false));
	char f[32];
	vps_offload_format(p->offload, f, sizeof(f));
	return vps_w_str_sparse(w, "offload", f, "0");
}

vps_result_t vps_parallel_read(struct vps_reader *r, const char *key, struct vps_parallel *p)
{
	vps_parallel_init(p);
	if (key)
		VPS_CHECK(vps_r_map_begin(r, key));
	for (size_t i = 0; i < sizeof(pkeys) / sizeof(pkeys[0]); i++) {
		const struct pkey *k = &pkeys[i];
		int64_t def = *pfield(p, k);
		VPS_CHECK(vps_r_int_opt(r, k->name, pfield(p, k), k->min, k->max, def));
	}
	const char *b;
	VPS_CHECK(vps_r_str_opt(r, "bucket", &b, "0"));
	if (!strcmp(b, "auto")) {
		p->bucket = VPS_BUCKET_AUTO;
	} else {
		char *end;
		long long v = strtoll(b, &end, 10);
		if (!*b || *end || v < 0)
			return vps_r_error(r, "bucket", "expected 'auto' or a number of elements, not '%s'", b);
		p->bucket = v;
	}
	VPS_CHECK(vps_r_bool_opt(r, "grad", &p->grad, false));
	VPS_CHECK(vps_r_bool_sparse(r, "grouped_gemm", &p->grouped_gemm, false));
	/* the keys added since (family and its mesh, the optimizer), only where
	 * they are not the defaults: every Megatron Adam configuration reads
	 * and prints as before they existed, and a binary document written
	 * before them has none */
	if (vps_reader_has(r, VPS_FEATURE_FAMILY)) {
		const char *family;
		VPS_CHECK(vps_r_str_sparse(r, "family", &family, "megatron"));
		if (family_parse(family, &p->family))
			return vps_r_error(r, "family", "expected megatron or dtensor, not '%s'", family);
		VPS_CHECK(vps_r_int_sparse(r, "dp_replicate", &p->dp_replicate, dkeys[2].min, dkeys[2].max, 1));
		VPS_CHECK(vps_r_int_sparse(r, "dp_shard", &p->dp_shard, dkeys[0].min, dkeys[0].max, 1));
	} else {
		struct vps_writer *echo = vps_reader_echo_writer(r);
		if (echo)
			VPS_CHECK(write_family(echo, p));
	}
	static const char *const text_keys[][2] = {
		{"optimizer", "adam"}, {"scalar", "adam"}, {"exp_avg", "fp32"}, {"exp_avg_sq", "fp32"}};
	if (!vps_reader_has(r, VPS_FEATURE_OPTIMIZER)) {
		struct vps_writer *echo = vps_reader_echo_writer(r);
		if (echo)
			VPS_CHECK(write_optimizer(echo, p));
		if (key)
			VPS_CHECK(vps_r_map_end(r));
		return VPS_OK;
	}
	for (size_t i = 0; i < sizeof(text_keys) / sizeof(text_keys[0]); i++) {
		const char *v;
		bool known;
		VPS_CHECK(vps_r_str_sparse(r, text_keys[i][0], &v, text_keys[i][1]));
		if (set_optimizer_key(p, text_keys[i][0], v, &known)) {
			char why[256];
			snprintf(why, sizeof(why), "%s", vps_last_error());
			return vps_r_error(r, text_keys[i][0], "%s", why);
		}
	}
	VPS_CHECK(vps_r_bool_sparse(r, "precision_aware", &p->precision_aware, false));
	if (vps_reader_has(r, VPS_FEATURE_OFFLOAD)) {
		const char *v;
		bool known;
		VPS_CHECK(vps_r_str_sparse(r, "offload", &v, "0"));
		if (set_optimizer_key(p, "offload", v, &known)) {
			char why[256];
			snprintf(why, sizeof(why), "%s", vps_last_error());
			return vps_r_error(r, "offload", "%s", why);
		}
	} else if (vps_reader_echo_writer(r)) {
		VPS_CHECK(vps_w_str_sparse(vps_reader_echo_writer(r), "offload", "0", "0"));
	}
	if (key)
		VPS_CHECK(vps_r_map_end(r));
	return VPS_OK;
}

vps_result_t vps_parallel_write(struct vps_writer *w, const char *key, const struct vps_parallel *p)
{
	VPS_CHECK(vps_w_map_begin(w, key));
	for (size_t i = 0; i < sizeof(pkeys) / sizeof(pkeys[0]); i++)
		VPS_CHECK(vps_w_int(w, pkeys[i].name, *pfield((struct vps_parallel *)p, &pkeys[i])));
	char b[32];
	if (p->bucket == VPS_BUCKET_AUTO)
		snprintf(b, sizeof(b), "auto");
	else
		snprintf(b, sizeof(b), "%" PRId64, p->bucket);
	VPS_CHECK(vps_w_str(w, "bucket", b));
	VPS_CHECK(vps_w_bool(w, "grad", p->grad));
	VPS_CHECK(vps_w_bool_sparse(w, "grouped_gemm", p->grouped_gemm, false));
	VPS_CHECK(write_family(w, p));
	VPS_CHECK(write_optimizer(w, p));
	return vps_w_map_end(w);
}

vps_result_t vps_parallel_load(struct vps_parallel *p, const char *arg, const char *search_path,
			       char *model_hint, size_t hint_len)
{
	vps_parallel_init(p);
	if (hint_len)
		model_hint[0] = '\0';
	if (strchr(arg, '='))
		return vps_parallel_parse(p, arg, NULL);
	char path[4096];
	if (vps_config_find(arg, search_path, "configuration", path, sizeof(path)))
		return vps_fail(VPS_ENOTFOUND, "'%s' is neither KEY=VALUE,... nor a known configuration (%s.yaml)",
				arg, arg);
	struct vps_bytes b;
	struct vps_reader *r = NULL;
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_reader_new(&r, path, b.data, b.len, VPS_DOC_PARALLEL);
	const char *hint = "";
	if (!rc)
		rc = vps_r_str_opt(r, "model", &hint, "");
	if (!rc && hint_len)
		snprintf(model_hint, hint_len, "%s", hint);
	if (!rc)
		rc = vps_parallel_read(r, NULL, p);
	if (!rc)
		rc = vps_reader_finish(r);
	vps_reader_free(r);
	vps_bytes_release(&b);
	return rc;
}

void vps_parallel_format(const struct vps_parallel *p, char *buf, size_t n)
{
	if (p->family == VPS_FAMILY_DTENSOR) {
		vps_dtensor_format(p, buf, n);
		return;
	}
	/* cp only when set: the text of every configuration without CP stays */
	char cp[32] = "";
	if (p->cp != 1)
		snprintf(cp, sizeof(cp), ",cp=%" PRId64, p->cp);
	int len = snprintf(buf, n, "tp=%" PRId64 ",pp=%" PRId64 ",dp=%" PRId64 "%s,ep=%" PRId64 ",etp=%" PRId64
			   ",vpp=%" PRId64 ",zero=%" PRId64,
			   p->tp, p->pp, p->dp, cp, p->ep, p->etp ? p->etp : p->tp, p->vpp, p->zero);
	if (len < 0 || (size_t)len >= n)
		return;
	if (p->first)
		len += snprintf(buf + len, n - (size_t)len, ",first=%" PRId64, p->first);
	if (p->last && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",last=%" PRId64, p->last);
	if (p->bucket && (size_t)len < n) {
		if (p->bucket == VPS_BUCKET_AUTO)
			len += snprintf(buf + len, n - (size_t)len, ",bucket=auto");
		else
			len += snprintf(buf + len, n - (size_t)len, ",bucket=%" PRId64, p->bucket);
	}
	if (p->grad && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",grad=1");
	if (p->grouped_gemm && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",grouped_gemm=1");
	if (p->optimizer != VPS_OPT_ADAM && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",optimizer=%s", vps_optimizer_name(p->optimizer));
	if (p->scalar_optimizer != VPS_OPT_ADAM && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",scalar=%s", vps_optimizer_name(p->scalar_optimizer));
	if (p->precision_aware && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",precision_aware=1");
	if (p->exp_avg_bf16 && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",exp_avg=bf16");
	if (p->exp_avg_sq_bf16 && len >= 0 && (size_t)len < n)
		len += snprintf(buf + len, n - (size_t)len, ",exp_avg_sq=bf16");
	if (p->offload > 0 && len >= 0 && (size_t)len < n) {
		char f[32];
		vps_offload_format(p->offload, f, sizeof(f));
		snprintf(buf + len, n - (size_t)len, ",offload=%s", f);
	}
}

/* The shortest text that reads back as the same double: the fraction is
 * compared as Megatron compares it, so it must survive every file. */
void vps_offload_format(double f, char *buf, size_t n)
{
	for (int digits = 1; digits <= 17; digits++) {
		snprintf(buf, n, "%.*g", digits, f);
		if (strtod(buf, NULL) == f)
			return;
	}
}

/* Layers per stage under Megatron's rules: first/last stages take their
 * given counts, the middle stages share the rest evenly. */
int64_t vps_parallel_stage_layers(const struct vps_parallel *p, const struct vps_model *m, int64_t stage)
{
	if (p->first && stage == 0)
		return p->first;
	if (p->last && stage == p->pp - 1)
		return p->last;
	int64_t middle = p->pp - (p->first ? 1 : 0) - (p->last ? 1 : 0);
	int64_t rest = m->layers - p->first - p->last;
	return middle > 0 ? rest / middle : 0;
}

int64_t vps_parallel_chunk_first_layer(const struct vps_parallel *p, const struct vps_model *m,
				       int64_t stage, int64_t chunk)
{
	/* chunk v of every stage comes after chunks 0..v-1 of all stages
	 * (get_transformer_layer_offset) */
	int64_t before = 0;
	if (stage > 0) {
		int64_t mid = vps_parallel_stage_layers(p, m, p->first ? 1 : 0);
		int64_t first = vps_parallel_stage_layers(p, m, 0);
		before = first / p->vpp + (stage - 1) * (mid / p->vpp);
		if (!p->first)
			before = stage * (mid / p->vpp);
	}
	return chunk * (m->layers / p->vpp) + before;
}

void vps_parallel_layer_place(const struct vps_parallel *p, const struct vps_model *m, int64_t layer,
			      int64_t *stage, int64_t *chunk)
{
	int64_t per_chunk_total = m->layers / p->vpp;
	int64_t v = layer / per_chunk_total, rel = layer % per_chunk_total;
	int64_t first = vps_parallel_stage_layers(p, m, 0) / p->vpp;
	int64_t s;
	if (rel < first) {
		s = 0;
	} else {
		int64_t mid = vps_parallel_stage_layers(p, m, p->first ? 1 : 0) / p->vpp;
		if (!p->first)
			s = mid ? rel / mid : 0;
		else
			s = mid ? 1 + (rel - first) / mid : 1;
		if (s > p->pp - 1)
			s = p->pp - 1;
	}
	*stage = s;
	*chunk = v;
}

/* The optimizers megatron-core 0.19.2 builds, and the combinations it
 * refuses, each with the rule that refuses it. */
static vps_result_t validate_optimizer(const struct vps_parallel *p, const struct vps_model *m, const char *where)
{
	const char *opt = vps_optimizer_name(p->optimizer);
	if (p->optimizer < 0 || p->optimizer >= VPS_NOPTIMIZERS ||
	    (p->scalar_optimizer != VPS_OPT_ADAM && p->scalar_optimizer != VPS_OPT_LION))
		return vps_fail(VPS_EINPUT, "%s: optimizer is one of adam, sgd, muon, lion and scalar adam or lion", where);
	if (p->scalar_optimizer != VPS_OPT_ADAM && p->optimizer != VPS_OPT_MUON)
		return vps_fail(VPS_EINPUT,
				"%s: scalar=%s applies to optimizer=muon (Megatron's --muon-scalar-optimizer); optimizer=%s "
				"leaves what it does not step to adam",
				where, vps_optimizer_name(p->scalar_optimizer), opt);
	if (p->optimizer == VPS_OPT_SGD && p->zero)
		return vps_fail(VPS_EINPUT,
				"%s: optimizer=sgd with zero=1: Megatron-Core's DistributedOptimizer takes Adam, its CPU-offload "
				"wrapper or an optimizer with an init_state_fn, and SGD has none (distrib_optimizer.py "
				"DistributedOptimizer.__init__); sgd runs with zero=0",
				where);
	if ((p->exp_avg_bf16 || p->exp_avg_sq_bf16) && !p->precision_aware)
		return vps_fail(VPS_EINPUT,
				"%s: exp_avg=bf16 and exp_avg_sq=bf16 need precision_aware=1 (optimizer_config.py: the moments "
				"are fp32 without --use-precision-aware-optimizer)",
				where);
	if (p->precision_aware && (p->optimizer != VPS_OPT_ADAM || !p->zero))
		return vps_fail(VPS_EINPUT,
				"%s: precision_aware=1 needs optimizer=adam and zero=1 (optimizer_config.py "
				"OptimizerConfig.__post_init__: adam under the distributed optimizer only)",
				where);
	if (p->offload > 0) {
		if (!p->zero || p->optimizer != VPS_OPT_ADAM)
			return vps_fail(VPS_EINPUT,
					"%s: offload needs optimizer=adam and zero=1 (Megatron-LM's --optimizer-cpu-offload "
					"needs --use-precision-aware-optimizer, which optimizer_config.py allows for adam "
					"under the distributed optimizer only)",
					where);
		if (p->exp_avg_bf16 || p->exp_avg_sq_bf16)
			return vps_fail(VPS_EINPUT,
					"%s: offload keeps every state in fp32 (the HybridDeviceOptimizer builds its "
					"sub-optimizers without --exp-avg-dtype/--exp-avg-sq-dtype): drop exp_avg and "
					"exp_avg_sq",
					where);
	}
	bool layerwise = (p->optimizer == VPS_OPT_MUON || p->optimizer == VPS_OPT_LION) && p->zero;
	if (layerwise && m->experts > 0 && m->bias && (p->ep > 1 || p->etp != p->tp))
		return vps_fail(VPS_EINPUT,
				"%s: optimizer=%s with zero=1 and expert biases in an expert buffer: Megatron-Core's layer-wise "
				"path has no distributed optimizer for expert parameters that are not 2-D weights "
				"(optimizer/__init__.py _get_megatron_emerging_optimizer: 'Non-emerging expert-parallel param "
				"groups are not yet supported')",
				where, opt);
	return VPS_OK;
}

vps_result_t vps_parallel_validate(struct vps_parallel *p, const struct vps_model *m, const char *where)
{
	int64_t g = m->query_groups;
	if (p->family == VPS_FAMILY_DTENSOR) {
		/* torchtitan's AdamW is what dtensor.c lays out and check-torch
		 * checks (exp_avg, exp_avg_sq: zeros_like of each fp32 local shard);
		 * the other keys name Megatron's optimizers and dtypes */
		char set[64] = "";
		if (p->optimizer != VPS_OPT_ADAM)
			snprintf(set, sizeof(set), "optimizer=%s", vps_optimizer_name(p->optimizer));
		else if (p->scalar_optimizer != VPS_OPT_ADAM)
			snprintf(set, sizeof(set), "scalar=%s", vps_optimizer_name(p->scalar_optimizer));
		else if (p->precision_aware || p->exp_avg_bf16 || p->exp_avg_sq_bf16)
			snprintf(set, sizeof(set), "%s", p->precision_aware ? "precision_aware=1"
						     : p->exp_avg_bf16  ? "exp_avg=bf16"
									: "exp_avg_sq=bf16");
		if (set[0])
			return vps_fail(VPS_EINPUT,
					"%s: %s is Megatron's (family=megatron); family=dtensor lays out PyTorch's Adam "
					"with fp32 moments (exp_avg, exp_avg_sq), as torchtitan builds it",
					where, set);
		return vps_dtensor_validate(p, m, where);
	}
	if (p->family != VPS_FAMILY_MEGATRON)
		return vps_fail(VPS_EINPUT, "%s: unknown family %" PRId64, where, p->family);
	if (p->dp_replicate != 1 || p->dp_shard != 1)
		return vps_fail(VPS_EINPUT, "%s: dp_replicate and dp_shard are a DTensor mesh's (family=dtensor)", where);
	if (!p->etp)
		p->etp = p->tp;
	/* every size is at least 1 (pkeys) but a struct may come from a caller;
	 * the product is bounded before anything uses it */
	int64_t world = 1;
	int64_t sizes[] = {p->ep, p->etp, p->vpp}, world_sizes[] = {p->tp, p->cp, p->dp, p->pp};
	for (size_t i = 0; i < 4; i++)
		if (world_sizes[i] < 1 || (i < 3 && sizes[i] < 1))
			return vps_fail(VPS_EINPUT, "%s: tp, cp, dp, pp, ep, etp and vpp must be at least 1", where);
	for (size_t i = 0; i < 4; i++)
		if (!vps_mul_ok(world, world_sizes[i], &world) || world > ((int64_t)1 << 24))
			return vps_fail(VPS_EINPUT, "%s: a world of tp x cp x dp x pp = %" PRId64 " x %" PRId64 " x %" PRId64
					" x %" PRId64 " ranks is too large (at most 2^24)",
					where, p->tp, p->cp, p->dp, p->pp);
	if (m->heads % p->tp)
		return vps_fail(VPS_EINPUT, "%s: tp=%" PRId64 " does not divide heads=%" PRId64 " of %s", where,
				p->tp, m->heads, m->name);
	if (g % p->tp && p->tp % g)
		return vps_fail(VPS_EINPUT,
				"%s: tp=%" PRId64 " neither divides nor is a multiple of num_query_groups=%" PRId64 " of %s",
				where, p->tp, g, m->name);
	int64_t qkv_rows = g * (m->heads / g + 2) * m->head_dim;
	if (qkv_rows % p->tp)
		return vps_fail(VPS_EINPUT, "%s: tp=%" PRId64 " does not divide the %" PRId64 " rows of linear_qkv",
				where, p->tp, qkv_rows);
	if ((m->experts == 0 || m->first_dense > 0) && m->ffn % p->tp)
		return vps_fail(VPS_EINPUT, "%s: tp=%" PRId64 " does not divide ffn=%" PRId64, where, p->tp, m->ffn);
	if (m->experts == 0 && p->grouped_gemm)
		return vps_fail(VPS_EINPUT, "%s: grouped_gemm applies to MoE models only (%s is dense)", where, m->name);
	if (m->shared_ffn % p->tp)
		return vps_fail(VPS_EINPUT, "%s: tp=%" PRId64 " does not divide shared_ffn=%" PRId64, where, p->tp,
				m->shared_ffn);
	if (m->experts == 0 && (p->ep != 1 || p->etp != p->tp))
		return vps_fail(VPS_EINPUT, "%s: ep and etp apply to MoE models only (%s is dense)", where, m->name);
	if (m->experts > 0) {
		if (m->experts % p->ep)
			return vps_fail(VPS_EINPUT, "%s: ep=%" PRId64 " does not divide experts=%" PRId64, where, p->ep,
					m->experts);
		if (m->moe_ffn % p->etp)
			return vps_fail(VPS_EINPUT, "%s: etp=%" PRId64 " does not divide moe_ffn=%" PRId64, where,
					p->etp, m->moe_ffn);
		/* etp and ep are bounded by moe_ffn and experts, tp*cp*dp by the world */
		if ((p->tp * p->cp * p->dp) % (p->etp * p->ep))
			return vps_fail(VPS_EINPUT,
					"%s: etp=%" PRId64 " x ep=%" PRId64 " does not divide tp x cp x dp = %" PRId64
					" (expert data parallel = world / (etp*ep*pp)); etp defaults to tp, try etp=1",
					where, p->etp, p->ep, p->tp * p->cp * p->dp);
	}
	if (p->vpp > 1 && p->pp == 1)
		return vps_fail(VPS_EINPUT, "%s: vpp=%" PRId64 " needs pp > 1", where, p->vpp);
	/* the MTP stage would hold the embedding copy and an output_layer.weight
	 * of its own (GPTModel allocates it where not pre_process) */
	if (m->mtp_layers > 0 && m->tied_embeddings && p->pp > 1)
		return vps_fail(VPS_EINPUT, "%s: mtp_layers with tied embeddings is modelled for pp=1 only (pp=%" PRId64 ")",
				where, p->pp);
	if ((p->first || p->last) && p->pp == 1)
		return vps_fail(VPS_EINPUT, "%s: first/last need pp > 1", where);
	if (p->first || p->last) {
		int64_t middle = p->pp - (p->first ? 1 : 0) - (p->last ? 1 : 0);
		int64_t rest = m->layers - p->first - p->last;
		if (rest < 0 || (middle == 0 && rest != 0))
			return vps_fail(VPS_EINPUT, "%s: first=%" PRId64 " + last=%" PRId64 " do not add up to layers=%" PRId64,
					where, p->first, p->last, m->layers);
		if (middle > 0 && (rest % middle || rest == 0))
			return vps_fail(VPS_EINPUT,
					"%s: the %" PRId64 " layers left after first/last do not split evenly over %" PRId64
					" middle stages",
					where, rest, middle);
	} else if (m->layers % p->pp) {
		return vps_fail(VPS_EINPUT,
				"%s: pp=%" PRId64 " does not divide layers=%" PRId64 " of %s (give first= and last=)", where,
				p->pp, m->layers, m->name);
	}
	for (int64_t s = 0; s < p->pp && s < 3; s++) {
		int64_t stage = s == 2 ? p->pp - 1 : s;
		int64_t n = vps_parallel_stage_layers(p, m, stage);
		if (n % p->vpp)
			return vps_fail(VPS_EINPUT, "%s: vpp=%" PRId64 " does not divide the %" PRId64
					" layers of pipeline stage %" PRId64,
					where, p->vpp, n, stage);
	}
	VPS_CHECK(validate_optimizer(p, m, where));
	/* Megatron-LM asks for --use-precision-aware-optimizer beside
	 * --optimizer-cpu-offload, but the hybrid optimizer keeps fp32 master
	 * params of its own instead of TransformerEngine's remainders: one
	 * layout, one spelling */
	if (p->offload > 0)
		p->precision_aware = false;
	return VPS_OK;
}

/* ---- devices ---- */

void vps_devices_packed(struct vps_devices *d, int64_t gpus_per_node, int64_t first_node)
{
	memset(d, 0, sizeof(*d));
	d->packed = true;
	d->gpus_per_node = gpus_per_node;
	d->first_node = first_node;
}

void vps_devices_release(struct vps_devices *d)
{
	free(d->list);
	free(d->order);
	memset(d, 0, sizeof(*d));
}

vps_result_t vps_devices_copy(struct vps_devices *dst, const struct vps_devices *src)
{
	*dst = *src;
	dst->list = NULL;
	dst->order = NULL;
	if (src->packed)
		return VPS_OK;
	dst->list = vps_malloc((size_t)src->n * sizeof(*src->list));
	dst->order = vps_malloc((size_t)src->n * sizeof(*src->order));
	if (!dst->list || !dst->order) {
		vps_devices_release(dst);
		return VPS_ENOMEM;
	}
	memcpy(dst->list, src->list, (size_t)src->n * sizeof(*src->list));
	if (src->order)
		memcpy(dst->order, src->order, (size_t)src->n * sizeof(*src->order));
	else
		for (int64_t i = 0; i < src->n; i++)
			dst->order[i] = i; /* vps_devices_validate sorts it */
	return VPS_OK;
}

struct vps_device vps_devices_get(const struct vps_devices *d, int64_t rank)
{
	struct vps_device dev;
	if (d->packed) {
		dev.node = (int32_t)(d->first_node + rank / d->gpus_per_node);
		dev.gpu = (int32_t)(rank % d->gpus_per_node);
	} else {
		dev = d->list[rank];
	}
	return dev;
}

static int dev_cmp(struct vps_device a, struct vps_device b)
{
	if (a.node != b.node)
		return a.node < b.node ? -1 : 1;
	return a.gpu < b.gpu ? -1 : a.gpu > b.gpu;
}

static int order_cmp(const void *a, const void *b, void *ctx)
{
	const struct vps_device *list = ctx;
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return dev_cmp(list[x], list[y]);
}

vps_result_t vps_devices_validate(struct vps_devices *d, int64_t world, const char *where)
{
	if (d->packed) {
		if (d->gpus_per_node < 1 || d->first_node < 0)
			return vps_fail(VPS_EINPUT, "%s: gpus per node must be positive", where);
		if (d->first_node + (world - 1) / d->gpus_per_node > INT32_MAX)
			return vps_fail(VPS_EINPUT, "%s: node numbers overflow", where);
		return VPS_OK;
	}
	if (d->n != world)
		return vps_fail(VPS_EINPUT, "%s: the device map lists %" PRId64 " devices but the world has %" PRId64
				" ranks", where, d->n, world);
	free(d->order);
	d->order = vps_malloc((size_t)d->n * sizeof(*d->order));
	if (!d->order)
		return VPS_ENOMEM;
	for (int64_t i = 0; i < d->n; i++)
		d->order[i] = i;
	qsort_r(d->order, (size_t)d->n, sizeof(*d->order), order_cmp, d->list);
	for (int64_t i = 1; i < d->n; i++) {
		struct vps_device a = d->list[d->order[i - 1]], b = d->list[d->order[i]];
		if (!dev_cmp(a, b))
			return vps_fail(VPS_EINPUT, "%s: ranks %" PRId64 " and %" PRId64 " are both on node %d gpu %d", where,
					d->order[i - 1], d->order[i], a.node, a.gpu);
	}
	return VPS_OK;
}

int64_t vps_devices_find(const struct vps_devices *d, int64_t world, struct vps_device dev)
{
	if (d->packed) {
		if (dev.gpu < 0 || dev.gpu >= d->gpus_per_node || dev.node < d->first_node)
			return -1;
		int64_t r = (dev.node - d->first_node) * d->gpus_per_node + dev.gpu;
		return r < world ? r : -1;
	}
	int64_t lo = 0, hi = d->n;
	while (lo < hi) {
		int64_t mid = (lo + hi) / 2;
		int c = dev_cmp(d->list[d->order[mid]], dev);
		if (c == 0)
			return d->order[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

size_t vps_devices_node_ranks(const struct vps_devices *d, int64_t world, int32_t node, int64_t *out, size_t max)
{
	size_t n = 0;
	if (d->packed) {
		int64_t lo = ((int64_t)node - d->first_node) * d->gpus_per_node;
		int64_t hi = vps_min64(lo + d->gpus_per_node, world);
		for (int64_t r = vps_max64(lo, 0); r < hi; r++, n++)
			if (n < max)
				out[n] = r;
		return n;
	}
	/* the sorted order groups a node's devices together */
	int64_t lo = 0, hi = d->n;
	while (lo < hi) {
		int64_t mid = (lo + hi) / 2;
		if (d->list[d->order[mid]].node < node)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (int64_t i = lo; i < d->n && d->list[d->order[i]].node == node; i++, n++)
		if (n < max)
			out[n] = d->order[i];
	/* callers want rank order */
	size_t k = n < max ? n : max;
	for (size_t i = 1; i < k; i++)
		for (size_t j = i; j > 0 && out[j - 1] > out[j]; j--) {
			int64_t t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

vps_result_t vps_devices_read(struct vps_reader *r, const char *key, struct vps_devices *d)
{
	memset(d, 0, sizeof(*d));
	if (key)
		VPS_CHECK(vps_r_map_begin(r, key));
	const char *mode;
	VPS_CHECK(vps_r_str_opt(r, "mode", &mode, vps_r_has(r, "devices") ? "list" : "packed"));
	if (!strcmp(mode, "packed")) {
		d->packed = true;
		VPS_CHECK(vps_r_int_opt(r, "gpus_per_node", &d->gpus_per_node, 1, 1 << 20, 8));
		VPS_CHECK(vps_r_int_opt(r, "first_node", &d->first_node, 0, INT32_MAX, 0));
	} else if (!strcmp(mode, "list")) {
		uint64_t n;
		/* a block list of flow pairs, which its items cannot tell */
		VPS_CHECK(vps_r_seq_begin_flow(r, "devices", &n, false));
		d->list = vps_malloc((size_t)n * sizeof(*d->list) + 1);
		if (!d->list)
			return VPS_ENOMEM;
		d->n = (int64_t)n;
		for (uint64_t i = 0; i < n; i++) {
			uint64_t two;
			int64_t node, gpu;
			VPS_CHECK(vps_r_seq_begin(r, NULL, &two));
			if (two != 2)
				return vps_r_error(r, NULL, "a device is [node, gpu]");
			VPS_CHECK(vps_r_int(r, NULL, &node, 0, INT32_MAX));
			VPS_CHECK(vps_r_int(r, NULL, &gpu, 0, INT32_MAX));
			VPS_CHECK(vps_r_seq_end(r));
			d->list[i].node = (int32_t)node;
			d->list[i].gpu = (int32_t)gpu;
		}
		VPS_CHECK(vps_r_seq_end(r));
	} else {
		return vps_r_error(r, "mode", "expected packed or list, not '%s'", mode);
	}
	if (key)
		VPS_CHECK(vps_r_map_end(r));
	return VPS_OK;
}

vps_result_t vps_devices_write(struct vps_writer *w, const char *key, const struct vps_devices *d)
{
	VPS_CHECK(vps_w_map_begin(w, key));
	VPS_CHECK(vps_w_str(w, "mode", d->packed ? "packed" : "list"));
	if (d->packed) {
		VPS_CHECK(vps_w_int(w, "gpus_per_node", d->gpus_per_node));
		VPS_CHECK(vps_w_int(w, "first_node", d->first_node));
	} else {
		VPS_CHECK(vps_w_seq_begin(w, "devices", (uint64_t)d->n, false));
		for (int64_t i = 0; i < d->n; i++) {
			VPS_CHECK(vps_w_seq_begin(w, NULL, 2, true));
			VPS_CHECK(vps_w_int(w, NULL, d->list[i].node));
			VPS_CHECK(vps_w_int(w, NULL, d->list[i].gpu));
			VPS_CHECK(vps_w_seq_end(w));
		}
		VPS_CHECK(vps_w_seq_end(w));
	}
	return vps_w_map_end(w);
}

vps_result_t vps_devices_load(struct vps_devices *d, const char *path)
{
	struct vps_bytes b;
	struct vps_reader *r = NULL;
	memset(d, 0, sizeof(*d));
	VPS_CHECK(vps_read_file(path, &b));
	vps_result_t rc = vps_reader_new(&r, path, b.data, b.len, VPS_DOC_DEVICES);
	if (!rc)
		rc = vps_devices_read(r, NULL, d);
	if (!rc)
		rc = vps_reader_finish(r);
	if (rc)
		vps_devices_release(d);
	vps_reader_free(r);
	vps_bytes_release(&b);
	return rc;
}
