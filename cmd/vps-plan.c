/* vps-plan: which bytes move from which device to which. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vps/io.h"
#include "vps/plan.h"
#include "vps/query.h"

const char *tool_name = "vps-plan";

static const char usage[] =
	"usage: vps-plan [--rank R] [--stats [--load] [--topology T]] [--threads N] [--yaml] [-o FILE]\n"
	"                [--global-batch N [--micro-batch N] [--micro-batch-before N]]\n"
	"                [--step N] [--consumed-samples N] [--scheduler-step N]\n"
	"                (A B | --transition NAME)\n"
	"       vps-plan --transfers [--rank R] [--peer P] [--tensor NAME|GLOB] [--state S]\n"
	"                [--stage N] [--format yaml|tsv|json] [-o FILE] (A B | --transition NAME | PLAN)\n"
	"       vps-plan -h | --version\n"
	"options:\n"
	"  --transition NAME      plan a transition of configs/transitions (or a file)\n"
	"  --rank R               only world rank R's part: its sends, receives and retains\n"
	"  --threads N            threads for a global plan (default: the online CPUs)\n"
	"  --stats                print statistics as YAML instead of the plan\n"
	"  --load                 with --stats: bytes each rank sends and receives\n"
	"  --topology T           with --stats: estimate the time on a topology\n"
	"  --global-batch N       samples per step (the split over the new data parallelism)\n"
	"  --micro-batch N        the micro batch after the switch (default: as before)\n"
	"  --micro-batch-before N the micro batch before the switch\n"
	"  --step N               optimizer steps taken\n"
	"  --consumed-samples N   samples consumed so far\n"
	"  --scheduler-step N     learning-rate scheduler position (default: the step)\n"
	"  --yaml                 write YAML instead of binary\n"
	"  --transfers            what rank R sends, receives and retains, one record a line; from\n"
	"                         A B (rank R's plan), or a plan or staged plan file PLAN\n"
	"  --peer P               with --transfers: only those to or from world rank P\n"
	"  --tensor NAME|GLOB     with --transfers: only those of the tensor(s)\n"
	"  --state S              with --transfers: only those of state S\n"
	"  --stage N              with --transfers of a staged plan: only stage N\n"
	"  --format F             with --transfers: yaml (default), tsv or json\n"
	"  -o, --output FILE      write FILE (through a temporary and a rename)\n"
	"  -h, --help             this text\n"
	"  --version              the version\n";

static void print_rank_stats(const struct vps_plan *p, int64_t r)
{
	int64_t send = 0, recv = 0, keep = 0, pieces = 0;
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		int64_t b = vps_piece_bytes(x);
		pieces++;
		if (x->src == x->dst)
			keep += b;
		else if (x->src == r)
			send += b;
		else
			recv += b;
	}
	printf("rank: %" PRId64 "\n", r);
	printf("world: %" PRId64 "\n", vps_world_size(p->world));
	printf("a_rank: %" PRId64 "\n", vps_world_a_rank(p->world, r));
	printf("b_rank: %" PRId64 "\n", vps_world_b_rank(p->world, r));
	printf("pieces: %" PRId64 "\n", pieces);
	printf("send_bytes: %" PRId64 "\n", send);
	printf("recv_bytes: %" PRId64 "\n", recv);
	printf("retained_bytes: %" PRId64 "\n", keep);
}

static void print_stats(const struct vps_plan *p, const struct vps_plan_stats *s, const struct vps_topology *topo,
			const struct vps_transition *tr)
{
	char a[256], b[256];
	vps_parallel_format(vps_layout_parallel(p->a), a, sizeof(a));
	vps_parallel_format(vps_layout_parallel(p->b), b, sizeof(b));
	if (tr && tr->name[0])
		printf("transition: %s\n", tr->name);
	printf("model: %s\n", vps_layout_model(p->a)->name);
	printf("from: \"%s\"\n", a);
	printf("to: \"%s\"\n", b);
	printf("world: %" PRId64 "\n", s->world);
	printf("joining: %" PRId64 "\n", s->joining);
	printf("leaving: %" PRId64 "\n", s->leaving);
	printf("pieces: %" PRId64 "\n", s->pieces);
	printf("retains: %" PRId64 "\n", s->retains);
	printf("bytes_moved: %" PRId64 "\n", s->bytes_moved);
	printf("bytes_retained: %" PRId64 "\n", s->bytes_retained);
	printf("bytes_lower_bound: %" PRId64 "\n", s->bytes_lower_bound);
	printf("moved_over_lower_bound: %.3f\n",
	       s->bytes_lower_bound ? (double)s->bytes_moved / (double)s->bytes_lower_bound : 1.0);
	printf("bytes_intra_node: %" PRId64 "\n", s->bytes_intra_node);
	printf("bytes_inter_node: %" PRId64 "\n", s->bytes_inter_node);
	printf("max_send_bytes: %" PRId64 "\n", s->max_send_bytes);
	printf("max_recv_bytes: %" PRId64 "\n", s->max_recv_bytes);
	printf("balanced_send_bound: %" PRId64 "\n", s->balanced_send_bound);
	printf("balanced_bound: %" PRId64 "\n", s->balanced_bound);
	printf("send_over_bound: %.3f\n",
	       s->balanced_send_bound ? (double)s->max_send_bytes / (double)s->balanced_send_bound : 1.0);
	printf("busiest_over_bound: %.3f\n",
	       s->balanced_bound ? (double)(s->max_send_bytes > s->max_recv_bytes ? s->max_send_bytes : s->max_recv_bytes) /
					   (double)s->balanced_bound
				 : 1.0);
	printf("peers_max: %" PRId64 "\n", s->peers_max);
	printf("collectives: %zu\n", p->ncolls);
	if (topo) {
		printf("topology: %s\n", topo->name);
		printf("estimate_seconds: %.4f\n", s->estimate_seconds);
		printf("time_bound_seconds: %.4f\n", s->time_bound_seconds);
		printf("estimate_over_time_bound: %.3f\n",
		       s->time_bound_seconds > 0 ? s->estimate_seconds / s->time_bound_seconds : 1.0);
	}
	if (tr && tr->paper_seconds > 0)
		printf("paper_seconds: %.3f\n", tr->paper_seconds);
	if (s->send) {
		printf("load:\n");
		for (int64_t w = 0; w < s->world; w++)
			printf("  - {rank: %" PRId64 ", send: %" PRId64 ", recv: %" PRId64 "}\n", w, s->send[w], s->recv[w]);
	}
}

static bool num(const char *flag, const char *s, int64_t *v)
{
	if (tool_parse_i64(s, v))
		return true;
	tool_usage_error("%s: '%s' is not a non-negative integer", flag, s);
	return false;
}

/* --transfers over a plan or staged plan file. */
static int query_file(const char *path, const struct vps_query *q, enum vps_format format, const char *out)
{
	struct vps_bytes in = {0}, bytes = {0};
	vps_result_t rc = vps_read_file(path, &in);
	if (!rc)
		rc = vps_query_document(strcmp(path, "-") ? path : "<stdin>", in.data, in.len, q, format, &bytes);
	if (!rc)
		rc = vps_write_output(out, &bytes, false);
	vps_bytes_release(&in);
	vps_bytes_release(&bytes);
	return rc ? tool_fail(rc) : tool_finish(EXIT_OK);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"rank", required_argument, NULL, 'r'},         {"stats", no_argument, NULL, 's'},
		{"load", no_argument, NULL, 'L'},               {"topology", required_argument, NULL, 't'},
		{"yaml", no_argument, NULL, 'y'},               {"output", required_argument, NULL, 'o'},
		{"transition", required_argument, NULL, 'T'},   {"global-batch", required_argument, NULL, 'G'},
		{"micro-batch", required_argument, NULL, 'M'},  {"micro-batch-before", required_argument, NULL, 'B'},
		{"step", required_argument, NULL, 'S'},         {"consumed-samples", required_argument, NULL, 'C'},
		{"scheduler-step", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},            {"threads", required_argument, NULL, 'j'},
		{"transfers", no_argument, NULL, 'X'},          {"peer", required_argument, NULL, 'P'},
		{"tensor", required_argument, NULL, 'N'},       {"state", required_argument, NULL, 'Q'},
		{"stage", required_argument, NULL, 'g'},        {"format", required_argument, NULL, 'F'},
		{0, 0, 0, 0}};
	const char *out = NULL, *topo_arg = NULL, *transition = NULL;
	bool stats = false, load = false, yaml = false;
	struct vps_plan_opts po = {.rank = -1};
	bool have_step = false, have_consumed = false, have_sched = false;
	int c, status = EXIT_USAGE;
	struct vps_query q;
	enum vps_format format = VPS_FORMAT_YAML;
	bool transfers = false, query_flags = false;
	vps_query_init(&q);
	while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
		switch (c) {
		case 'r':
			if (!num("--rank", optarg, &po.rank))
				return EXIT_USAGE;
			break;
		case 'j': {
			int64_t n;
			if (!num("--threads", optarg, &n))
				return EXIT_USAGE;
			if (n < 1 || n > VPS_PLAN_MAX_THREADS)
				return tool_usage_error("--threads: %" PRId64 " is not from 1 to %d", n, VPS_PLAN_MAX_THREADS);
			po.threads = (int)n;
			break;
		}
		case 's': stats = true; break;
		case 'L': load = true; break;
		case 't': topo_arg = optarg; break;
		case 'y': yaml = true; break;
		case 'o': out = optarg; break;
		case 'T': transition = optarg; break;
		case 'G':
			if (!num("--global-batch", optarg, &po.train.global_batch))
				return EXIT_USAGE;
			break;
		case 'M':
			if (!num("--micro-batch", optarg, &po.train.micro_batch))
				return EXIT_USAGE;
			break;
		case 'B':
			if (!num("--micro-batch-before", optarg, &po.micro_batch_a))
				return EXIT_USAGE;
			break;
		case 'S':
			if (!num("--step", optarg, &po.train.step))
				return EXIT_USAGE;
			have_step = true;
			break;
		case 'C':
			if (!num("--consumed-samples", optarg, &po.train.consumed_samples))
				return EXIT_USAGE;
			have_consumed = true;
			break;
		case 'l':
			if (!num("--scheduler-step", optarg, &po.train.scheduler_step))
				return EXIT_USAGE;
			have_sched = true;
			break;
		case 'X': transfers = true; break;
		case 'P':
		case 'N':
		case 'Q':
		case 'g':
		case 'F':
			query_flags = true;
			if ((c == 'P' && !num("--peer", optarg, &q.peer)) || (c == 'g' && !num("--stage", optarg, &q.stage)))
				return EXIT_USAGE;
			if (c == 'Q' && vps_state_parse(optarg, &q.state))
				return tool_usage_error("--state: %s (param, main_param, exp_avg, exp_avg_sq or grad)",
							vps_last_error());
			if (c == 'F' && vps_format_parse(optarg, &format))
				return tool_fail(VPS_EINPUT);
			if (c == 'N')
				q.tensor = optarg;
			break;
		case 'h': fputs(usage, stdout); return tool_finish(EXIT_OK);
		case 'V': printf("vps-plan %s\n", VPS_VERSION_STRING); return tool_finish(EXIT_OK);
		default: fputs(usage, stderr); return EXIT_USAGE;
		}
	}
	if (query_flags && !transfers)
		return tool_usage_error("--peer, --tensor, --state, --stage and --format go with --transfers");
	if (transfers && (stats || yaml))
		return tool_usage_error("--transfers is a query: --stats and --yaml do not apply (--format yaml)");
	q.rank = po.rank;
	if (transfers && !transition && argc - optind == 1)
		return query_file(argv[optind], &q, format, out);
	if (transfers && po.rank < 0)
		return tool_usage_error("--transfers needs --rank R with two layouts or a transition");
	if (transition ? argc != optind : argc - optind != 2)
		return tool_usage_error("expected two layouts or --transition NAME\n%s", usage);
	if ((load || topo_arg) && !stats)
		return tool_usage_error("--load and --topology go with --stats");
	if (have_step != have_consumed)
		return tool_usage_error("--step and --consumed-samples go together (the data position is both)");
	if (have_sched && !have_step)
		return tool_usage_error("--scheduler-step needs --step and --consumed-samples");
	po.train.known = have_step;
	if (have_step && !have_sched)
		po.train.scheduler_step = po.train.step;
	if ((po.train.micro_batch || po.micro_batch_a) && !po.train.global_batch)
		return tool_usage_error("--micro-batch and --micro-batch-before need --global-batch");
	struct vps_layout *a = NULL, *b = NULL;
	struct vps_plan *p = NULL;
	struct vps_topology topo;
	struct vps_transition tr = {0};
	struct vps_bytes bytes = {0};
	struct vps_plan_stats s = {0};
	vps_result_t rc;
	if (topo_arg && (rc = vps_topology_load(&topo, topo_arg, tool_config_path("topologies"))))
		goto fail;
	if (transition) {
		char tp[4096], mp[4096], pp[4096];
		snprintf(tp, sizeof(tp), "%s", tool_config_path("transitions"));
		snprintf(mp, sizeof(mp), "%s", tool_config_path("models"));
		snprintf(pp, sizeof(pp), "%s", tool_config_path("parallel"));
		if ((rc = vps_transition_load(transition, tp, mp, pp, &tr, &a, &b)))
			goto fail;
	} else {
		if ((rc = vps_layout_load(&a, argv[optind])))
			goto fail;
		if (!strcmp(argv[optind], "-") && !strcmp(argv[optind + 1], "-")) {
			status = tool_usage_error("only one of the layouts can be standard input");
			goto done;
		}
		if ((rc = vps_layout_load(&b, argv[optind + 1])))
			goto fail;
	}
	/* the tool only hashes, writes or counts a global plan's pieces */
	po.compact = true;
	po.unhashed = stats;
	if ((rc = vps_plan_compute(&p, a, b, &po)))
		goto fail;
	a = b = NULL;
	if (transfers) {
		if ((rc = vps_query_transfers(p, &q, format, &bytes)) || (rc = vps_write_output(out, &bytes, false)))
			goto fail;
		status = tool_finish(EXIT_OK);
		goto done;
	}
	if (stats) {
		if (po.rank >= 0) {
			print_rank_stats(p, po.rank);
		} else {
			if ((rc = vps_plan_stats(p, topo_arg ? &topo : NULL, load, &s)))
				goto fail;
			print_stats(p, &s, topo_arg ? &topo : NULL, &tr);
		}
		status = tool_finish(EXIT_OK);
		goto done;
	}
	if ((rc = vps_plan_serialize(p, yaml, &bytes)) || (rc = vps_write_output(out, &bytes, !yaml)))
		goto fail;
	status = tool_finish(EXIT_OK);
	goto done;
fail:
	status = tool_fail(rc);
done:
	vps_plan_stats_release(&s);
	vps_bytes_release(&bytes);
	vps_plan_free(p);
	vps_layout_free(a);
	vps_layout_free(b);
	return status;
}
