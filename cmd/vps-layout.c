/* vps-layout: compute a model's layout under a parallel configuration. */
#include <getopt.h>
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
	"                       grad=,grouped_gemm=\n"
	"                       or a configuration name or file\n"
	"  --gpus-per-node N    ranks packed N to a node (default 8)\n"
	"  --first-node K       the first node of the packed ranks (default 0)\n"
	"  --devices FILE       (node, gpu) of every rank\n"
	"  -i, --input LAYOUT   read a layout instead of computing one\n"
	"  --rank R             write rank R's sub-VPS (0,3,5-7 or all; repeatable)\n"
	"  --stats              print statistics as YAML\n"
	"  --yaml               write YAML instead of binary\n"
	"  --tensor NAME|GLOB   who holds the tensor(s): ranks, buffer, offset, strides\n"
	"  --state S            with --tensor: only state S (param, main_param, exp_avg, ...)\n"
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
	fprintf(stderr, "layout: %s on %" PRId64 " ranks (%s); ", vps_layout_model(l)->name, s->world, par);
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

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'},     {"parallel", required_argument, NULL, 'p'},
		{"gpus-per-node", required_argument, NULL, 'g'}, {"first-node", required_argument, NULL, 'f'},
		{"devices", required_argument, NULL, 'd'},   {"rank", required_argument, NULL, 'r'},
		{"stats", no_argument, NULL, 's'},           {"yaml", no_argument, NULL, 'y'},
		{"output", required_argument, NULL, 'o'},    {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},         {"input", required_argument, NULL, 'i'},
		{"tensor", required_argument, NULL, 'T'},    {"state", required_argument, NULL, 'S'},
		{"box", required_argument, NULL, 'b'},       {"format", required_argument, NULL, 'F'},
		{"human", no_argument, NULL, 'H'},           {"quiet", no_argument, NULL, 'q'},
		{0, 0, 0, 0}};
	const char *input = NULL, *model_arg = NULL, *parallel_arg = NULL, *devices_arg = NULL, *out = NULL;
	int64_t gpn = 8, first_node = 0;
	int64_t *ranks = NULL;
	size_t nranks = 0, cap = 0;
	bool all = false, stats = false, yaml = false, human = false, quiet = false;
	int c, status = EXIT_USAGE;
	struct vps_model m;
	struct vps_parallel p;
	struct vps_devices d = {0};
	struct vps_layout *l = NULL;
	struct vps_bytes bytes = {0};
	char hint[64] = "";
	vps_result_t rc;
	struct vps_query q;
	enum vps_format format = VPS_FORMAT_YAML;
	bool query_flags = false;
	vps_query_init(&q);

	while ((c = getopt_long(argc, argv, "hHqi:o:", opts, NULL)) != -1) {
		switch (c) {
		case 'i': input = optarg; break;
		case 'm': model_arg = optarg; break;
		case 'p': parallel_arg = optarg; break;
		case 'g':
			if (!tool_parse_i64(optarg, &gpn) || gpn < 1)
				return tool_usage_error("--gpus-per-node: '%s' is not a positive integer", optarg);
			break;
		case 'f':
			if (!tool_parse_i64(optarg, &first_node))
				return tool_usage_error("--first-node: '%s' is not a node number", optarg);
			break;
		case 'd': devices_arg = optarg; break;
		case 'r':
			if (!tool_parse_ranks(optarg, &ranks, &nranks, &cap, &all)) {
				free(ranks);
				return tool_usage_error("--rank: '%s' is not a rank list (0,3,5-7 or all)", optarg);
			}
			break;
		case 's': stats = true; break;
		case 'y': yaml = true; break;
		case 'H': human = true; break;
		case 'q': quiet = true; break;
		case 'o': out = optarg; break;
		case 'T': q.tensor = optarg; break;
		case 'S':
		case 'b':
		case 'F':
			query_flags = true;
			if ((c == 'S' && vps_state_parse(optarg, &q.state)) || (c == 'b' && vps_box_parse(optarg, &q.box)) ||
			    (c == 'F' && vps_format_parse(optarg, &format))) {
				free(ranks);
				return c == 'S' ? tool_usage_error("--state: %s (param, main_param, exp_avg, exp_avg_sq or grad)",
								       vps_last_error())
						 : tool_fail(VPS_EINPUT);
			}
			q.has_box |= c == 'b';
			break;
		case 'h': fputs(usage, stdout); free(ranks); return tool_finish(EXIT_OK);
		case 'V': printf("vps-layout %s\n", VPS_VERSION_STRING); free(ranks); return tool_finish(EXIT_OK);
		default: fputs(usage, stderr); free(ranks); return EXIT_USAGE;
		}
	}
	if (optind != argc) {
		free(ranks);
		return tool_usage_error("unexpected argument '%s'\n%s", argv[optind], usage);
	}
	if (query_flags && !q.tensor) {
		free(ranks);
		return tool_usage_error("--state, --box and --format go with --tensor");
	}
	if (q.tensor && (nranks || all || stats || yaml)) {
		free(ranks);
		return tool_usage_error("--tensor is a query: --rank, --stats and --yaml do not apply (--format yaml)");
	}
	if (input) {
		if (model_arg || parallel_arg || devices_arg) {
			free(ranks);
			return tool_usage_error("-i reads a layout: --model, --parallel and --devices do not apply");
		}
		if ((rc = vps_layout_load(&l, input)))
			goto fail;
		goto have_layout;
	}
	vps_parallel_init(&p);
	if (parallel_arg && (rc = vps_parallel_load(&p, parallel_arg, tool_config_path("parallel"), hint,
						    sizeof(hint))))
		goto fail;
	if (!model_arg && !hint[0]) {
		free(ranks);
		return tool_usage_error("--model is required\n%s", usage);
	}
	if ((rc = vps_model_load(&m, model_arg ? model_arg : hint, tool_config_path("models"))))
		goto fail;
	if (devices_arg) {
		if ((rc = vps_devices_load(&d, devices_arg)))
			goto fail;
	} else {
		vps_devices_packed(&d, gpn, first_node);
	}
	if ((rc = vps_layout_new(&l, &m, &p, &d, parallel_arg ? "--parallel" : "layout")))
		goto fail;
have_layout:
	if (all) {
		int64_t world = vps_layout_world(l);
		int64_t *every = realloc(ranks, (size_t)world * sizeof(*ranks));
		if (!every) {
			status = tool_usage_error("out of memory for %" PRId64 " ranks", world);
			goto done;
		}
		ranks = every;
		for (int64_t r = 0; r < world; r++)
			ranks[r] = r;
		nranks = (size_t)world;
	}
	for (size_t i = 0; i < nranks; i++)
		if (ranks[i] >= vps_layout_world(l)) {
			status = tool_usage_error("--rank: %" PRId64 " is outside the world of %" PRId64 " ranks", ranks[i],
						  vps_layout_world(l));
			goto done;
		}
	if (q.tensor) {
		if ((rc = vps_query_holders(l, &q, format, &bytes)) || (rc = vps_write_output(out, &bytes, false)))
			goto fail;
		status = tool_finish(EXIT_OK);
		goto done;
	}
	struct vps_layout_stats s;
	bool summary = !stats && tool_summary_wanted(quiet, out);
	if ((stats || summary) && (rc = vps_layout_stats(l, &s)))
		goto fail;
	if (stats) {
		print_stats(l, &s, ranks, nranks, tool_human(human));
		status = tool_finish(EXIT_OK);
		goto done;
	}
	if ((rc = vps_layout_serialize(l, ranks, nranks, yaml, &bytes)))
		goto fail;
	if ((rc = vps_write_output(out, &bytes, !yaml)))
		goto fail;
	status = tool_finish(EXIT_OK);
	if (summary && !status)
		print_summary(l, &s, nranks);
	goto done;
fail:
	status = tool_fail(rc);
done:
	vps_bytes_release(&bytes);
	vps_layout_free(l);
	vps_devices_release(&d);
	free(ranks);
	return status;
}
