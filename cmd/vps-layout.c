/* vps-layout: compute a model's layout under a parallel configuration. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/layout.h"
#include "vps/query.h"
#include "vps/units.h"

const char *tool_name = "vps-layout";

static const char usage[] =
	"usage: vps-layout --model MODEL [--parallel SPEC] [--gpus-per-node N] [--first-node K]\n"
	"                  [--devices FILE] [--rank R]... [--stats] [--yaml] [-o FILE] [-H] [-q]\n"
	"       vps-layout -i LAYOUT [--rank R]... [--stats] [--yaml] [-o FILE] [-H] [-q]\n"
	"       vps-layout (--model MODEL [--parallel SPEC] ... | -i LAYOUT) --tensor NAME|GLOB\n"
	"                  [--state S] [--box LO:HI,...] [--format yaml|tsv|json] [-o FILE]\n"
	"       vps-layout -h | --version\n"
	"options:\n"
	"  --model MODEL        model name (configs/models), vps model file or config.json\n"
	"  --parallel SPEC      tp=,pp=,dp=,cp=,ep=,etp=,vpp=,zero=,first=,last=,bucket=,\n"
	"                       grad=,grouped_gemm=,optimizer=,scalar=,precision_aware=,\n"
	"                       exp_avg=,exp_avg_sq=\n"
	"                       or a configuration name or file\n"
	"  --gpus-per-node N    ranks packed N to a node (default 8)\n"
	"  --first-node K       the first node of the packed ranks (default 0)\n"
	"  --devices FILE       (node, gpu) of every rank\n"
	"  -i, --input LAYOUT   read a layout instead of computing one\n"
	"  --rank R             write rank R's sub-VPS (0,3,5-7 or all; repeatable)\n"
	"  --stats              print statistics as YAML\n"
	"  --yaml               write YAML instead of binary\n"
	"  --tensor NAME|GLOB   who holds the tensor(s): ranks, buffer, offset, strides\n"
	"  --state S            with --tensor: only state S (param, main_param, exp_avg,\n"
	"                       momentum_buffer, ...)\n"
	"  --box LO:HI,...      with --tensor: only what intersects the box, clipped to it\n"
	"  --format F           with --tensor: yaml (default), tsv or json (one record a line)\n"
	"  -o, --output FILE    write FILE (through a temporary and a rename)\n"
	"  -H, --human          --stats in KiB, MiB, GiB even when not on a terminal\n"
	"  -q, --quiet          no summary line on standard error\n"
	"  -h, --help           this text\n"
	"  --version            the version\n";

static void print_stats(const struct vps_layout *l, const struct vps_layout_stats *s, const int64_t *ranks,
			size_t nranks, bool h)
{
	char n[TOOL_NUM];
	const struct vps_model *m = vps_layout_model(l);
	char par[256];
	vps_parallel_format(vps_layout_parallel(l), par, sizeof(par));
	printf("model: %s\n", m->name);
	printf("parameters: %" PRId64 "\n", s->parameters);
	if (vps_model_module_buffers(m))
		printf("module_buffers: %" PRId64 "\n", vps_model_module_buffers(m));
	printf("tensors: %u\n", s->tensors);
	printf("parallel: \"%s\"\n", par);
	printf("world: %" PRId64 "\n", s->world);
	printf("expert_data_parallel: %" PRId64 "\n", s->edp);
	printf("expert_buffer: %s\n", vps_layout_expert_buffer(l) ? "true" : "false");
	printf("states: [");
	for (int st = 0, any = 0; st < VPS_NSTATES; st++)
		if (vps_layout_has_state(l, st))
			printf("%s%s", any++ ? ", " : "", vps_state_name(st));
	printf("]\n");
	printf("dtypes: {");
	for (int st = 0, any = 0; st < VPS_NSTATES; st++)
		if (vps_layout_has_state(l, st))
			printf("%s%s: %s", any++ ? ", " : "", vps_state_name(st), vps_dtype_name(vps_layout_state_dtype(l, st)));
	printf("}\n");
	const struct vps_parallel *p = vps_layout_parallel(l);
	printf("optimizer: %s\n", vps_optimizer_name(p->optimizer));
	/* Muon and Lion leave what is not a 2-D weight to another; with zero=1
	 * they are Megatron's layer-wise optimizer */
	if (p->optimizer == VPS_OPT_MUON || p->optimizer == VPS_OPT_LION) {
		printf("scalar_optimizer: %s\n", vps_optimizer_name(p->scalar_optimizer));
		printf("layer_wise: %s\n", p->zero ? "true" : "false");
	}
	if (p->offload > 0) {
		char f[32];
		vps_offload_format(p->offload, f, sizeof(f));
		printf("offload: %s\n", f);
	}
	printf("logical_bytes: %s\n", tool_bytes(s->logical_bytes, h, n, sizeof(n)));
	printf("total_bytes: %s\n", tool_bytes(s->total_bytes, h, n, sizeof(n)));
	printf("copies: %.4f\n", s->logical_bytes ? (double)s->total_bytes / (double)s->logical_bytes : 0.0);
	printf("rank_bytes_max: %s\n", tool_bytes(s->max_rank_bytes, h, n, sizeof(n)));
	printf("rank_bytes_min: %s\n", tool_bytes(s->min_rank_bytes, h, n, sizeof(n)));
	printf("buckets_per_rank_max: %" PRId64 "\n", s->buckets);
	printf("hash: \"0x%016" PRIx64 "\"\n", vps_layout_hash(l));
	if (!nranks)
		return;
	printf("ranks:\n");
	for (size_t i = 0; i < nranks; i++) {
		struct vps_rank_view v;
		if (vps_layout_rank(l, ranks[i], &v))
			continue;
		int64_t bytes = 0;
		for (size_t b = 0; b < v.nbuffers; b++)
			bytes += v.buffers[b].elements * (int64_t)vps_dtype_size(v.buffers[b].dtype);
		printf("  - rank: %" PRId64 "\n", v.rank);
		printf("    device: [%d, %d]\n", v.device.node, v.device.gpu);
		printf("    coords: {tp: %" PRId64 ", cp: %" PRId64 ", dp: %" PRId64 ", pp: %" PRId64 ", etp: %" PRId64
		       ", ep: %" PRId64 ", edp: %" PRId64 "}\n",
		       v.coords.tp, v.coords.cp, v.coords.dp, v.coords.pp, v.coords.etp, v.coords.ep, v.coords.edp);
		printf("    buffers: %zu\n", v.nbuffers);
		printf("    params: %zu\n", v.nparams);
		printf("    regions: %zu\n", v.nregions);
		printf("    bytes: %s\n", tool_bytes(bytes, h, n, sizeof(n)));
		vps_rank_view_release(&v);
	}
}

/* The summary line (stderr): the ranks and what each holds. */
static void print_summary(const struct vps_layout *l, const struct vps_layout_stats *s, size_t nranks)
{
	char par[256], a[VPS_UNITS_LEN], b[VPS_UNITS_LEN], t[VPS_UNITS_LEN];
	vps_parallel_format(vps_layout_parallel(l), par, sizeof(par));
	fprintf(stderr, "layout: %s on %" PRId64 " rank%s (%s); ", vps_layout_model(l)->name, s->world, tool_s(s->world),
		par);
	vps_format_bytes(s->min_rank_bytes, a, sizeof(a));
	vps_format_bytes(s->max_rank_bytes, b, sizeof(b));
	/* a range only where the printed ends differ */
	if (!strcmp(a, b))
		fprintf(stderr, "%s a rank", b);
	else
		fprintf(stderr, "%s to %s a rank", a, b);
	fprintf(stderr, ", %s in all (%.2fx the state)", vps_format_bytes(s->total_bytes, t, sizeof(t)),
		s->logical_bytes ? (double)s->total_bytes / (double)s->logical_bytes : 0.0);
	if (nranks)
		fprintf(stderr, "; %zu rank%s written in full", nranks, nranks == 1 ? "" : "s");
	fputc('\n', stderr);
}

static bool parse_box(const char *arg, void *query, char *why, size_t n)
{
	struct vps_query *q = query;
	if (!vps_box_parse(arg, &q->box))
		return q->has_box = true;
	snprintf(why, n, "%s", vps_last_error());
	return false;
}

/* What the command line asks for. */
struct layout_args {
	const char *input, *model, *parallel, *devices;
	int64_t gpus_per_node, first_node;
	struct tool_ranks ranks;
	bool stats;
	struct vps_query q;
};

/* The layout read (-i) or computed. 0, or the exit status of the error printed. */
static int make_layout(const struct layout_args *a, struct vps_layout **l)
{
	struct vps_parallel p;
	struct vps_model m;
	struct vps_devices d = {0};
	char hint[64] = "";
	vps_result_t rc;
	if (a->input)
		return (rc = vps_layout_load(l, a->input)) ? tool_fail(rc) : 0;
	vps_parallel_init(&p);
	/* a spec (tp=2,...) is no file: what is wrong with it is the flag's */
	if (a->parallel && (rc = vps_parallel_load(&p, a->parallel, tool_config_path("parallel"), hint, sizeof(hint))))
		return strchr(a->parallel, '=') ? tool_fail_at("--parallel", rc) : tool_fail_lookup("--parallel", rc);
	/* a configuration file may name its model */
	if (!a->model && !hint[0])
		return tool_usage_error("--model is required");
	/* a model the configuration names is the --parallel's */
	if ((rc = vps_model_load(&m, a->model ? a->model : hint, tool_config_path("models"))))
		return tool_fail_lookup(a->model ? "--model" : "--parallel", rc);
	/* a configuration written for one model does not silently shape another */
	if (a->model && hint[0] && strcmp(m.name, hint) != 0)
		return tool_usage_error("--parallel: %s is %s's configuration, and --model is %s (leave out --model, or "
					"give the shape as tp=..,pp=..,dp=..)",
					a->parallel, hint, m.name);
	if (a->devices)
		rc = vps_devices_load(&d, a->devices);
	else
		vps_devices_packed(&d, a->gpus_per_node, a->first_node);
	if (!rc)
		rc = vps_layout_new(l, &m, &p, &d, a->parallel ? "--parallel" : "layout");
	vps_devices_release(&d);
	return rc ? tool_fail(rc) : 0;
}

/* --rank all made every rank; a rank outside the world refused. */
static int check_ranks(struct tool_ranks *r, const struct vps_layout *l)
{
	int64_t world = vps_layout_world(l);
	if (r->all) {
		int64_t *every = realloc(r->list, (size_t)world * sizeof(*every));
		if (!every)
			return tool_error(EXIT_USAGE, "out of memory for %" PRId64 " ranks", world);
		for (int64_t i = 0; i < world; i++)
			every[i] = i;
		r->list = every;
		r->n = r->cap = (size_t)world;
	}
	for (size_t i = 0; i < r->n; i++)
		if (r->list[i] >= world)
			return tool_error(EXIT_USAGE, "--rank: %" PRId64 " is outside the world of %" PRId64 " ranks",
					  r->list[i], world);
	return 0;
}

/* Who holds the tensors the query names. */
static int holders(const struct vps_layout *l, const struct vps_query *q, const struct tool_common *c)
{
	struct vps_bytes bytes = {0};
	vps_result_t rc = vps_query_holders(l, q, c->format, &bytes);
	if (!rc)
		rc = vps_write_output(c->out, &bytes, false);
	vps_bytes_release(&bytes);
	return rc ? tool_fail(rc) : tool_finish(EXIT_OK);
}

/* The layout (of the ranks asked for), or its statistics. */
static int write_layout(const struct vps_layout *l, const struct layout_args *a, const struct tool_common *c)
{
	struct vps_bytes bytes = {0};
	struct vps_layout_stats s;
	bool summary = !a->stats && tool_summary_wanted(c->quiet, c->out);
	vps_result_t rc;
	if ((a->stats || summary) && (rc = vps_layout_stats(l, &s)))
		return tool_fail(rc);
	if (a->stats) {
		print_stats(l, &s, a->ranks.list, a->ranks.n, tool_human(c->human));
		return tool_finish(EXIT_OK);
	}
	if (!(rc = vps_layout_serialize(l, a->ranks.list, a->ranks.n, c->yaml, &bytes)))
		rc = vps_write_output(c->out, &bytes, !c->yaml);
	vps_bytes_release(&bytes);
	if (rc)
		return tool_fail(rc);
	int status = tool_finish(EXIT_OK);
	if (summary && !status)
		print_summary(l, &s, a->ranks.n);
	return status;
}

int main(int argc, char **argv)
{
	struct layout_args a = {.gpus_per_node = 8};
	struct tool_option options[] = {
		TOOL_OPT_STRING(0, "model", &a.model),
		TOOL_OPT_STRING(0, "parallel", &a.parallel),
		TOOL_OPT_INT("gpus-per-node", &a.gpus_per_node, 1, INT64_MAX, "a positive integer"),
		TOOL_OPT_INT("first-node", &a.first_node, 0, INT64_MAX, "a node number"),
		TOOL_OPT_STRING(0, "devices", &a.devices),
		TOOL_OPT_STRING('i', "input", &a.input),
		TOOL_OPT_FUNC(0, "rank", &a.ranks, tool_rank_list),
		TOOL_OPT_BOOL(0, "stats", &a.stats),
		TOOL_OPT_STRING(0, "tensor", &a.q.tensor),
		TOOL_OPT_FUNC(0, "state", &a.q.state, tool_state),
		TOOL_OPT_FUNC(0, "box", &a.q, parse_box),
		TOOL_OPT_END,
	};
	static const struct tool_rule rules[] = {
		{"state box format", "tensor", NULL, "--state, --box and --format go with --tensor"},
		{"tensor", NULL, "rank stats yaml", "--tensor is a query: --rank, --stats and --yaml do not apply (--format yaml)"},
		{"input", NULL, "model parallel devices", "-i reads a layout: --model, --parallel and --devices do not apply"},
		{0},
	};
	struct tool_cli cli = {.usage = usage,
			       .shared = TOOL_OUTPUT | TOOL_YAML | TOOL_HUMAN | TOOL_QUIET | TOOL_FORMAT,
			       .options = options,
			       .rules = rules};
	struct vps_layout *l = NULL;
	vps_query_init(&a.q);
	int status = tool_parse(&cli, argc, argv);
	if (status == TOOL_PARSED)
		status = tool_operands(&cli, 0, 0, "options only");
	if (status != TOOL_PARSED)
		goto done;
	if ((status = make_layout(&a, &l)) || (status = check_ranks(&a.ranks, l)))
		goto done;
	status = a.q.tensor ? holders(l, &a.q, &cli.common) : write_layout(l, &a, &cli.common);
done:
	vps_layout_free(l);
	tool_ranks_release(&a.ranks);
	return status;
}
