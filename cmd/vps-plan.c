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
#include "vps/svg.h"
#include "vps/units.h"

const char *tool_name = "vps-plan";

/* Refused: ranges of the source that no surviving device holds (--lost
 * without --allow-loss). Neither bad input (2) nor a failed check (1). */
enum { EXIT_LOST = 3 };

static const char usage[] =
	"usage: vps-plan [--rank R] [--stats [--load]] [--topology T] [--threads N] [--yaml] [-o FILE]\n"
	"                [--svg FILE] [-H] [-q]\n"
	"                [--global-batch N [--micro-batch N] [--micro-batch-before N]]\n"
	"                [--step N] [--consumed-samples N] [--scheduler-step N]\n"
	"                [--lost RANKS|DEVICES [--allow-loss] [--format yaml|tsv|json]]\n"
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
	"  --topology T           estimate the time on a topology (--stats and the summary)\n"
	"  --svg FILE             draw the traffic (heatmap and per-rank bars) as SVG in FILE;\n"
	"                         the plan is written too only with -o\n"
	"  -H, --human            --stats in GiB, s, ms even when not on a terminal\n"
	"  -q, --quiet            no summary line on standard error\n"
	"  --global-batch N       samples per step (the split over the new data parallelism)\n"
	"  --micro-batch N        the micro batch after the switch (default: as before)\n"
	"  --micro-batch-before N the micro batch before the switch\n"
	"  --step N               optimizer steps taken\n"
	"  --consumed-samples N   samples consumed so far\n"
	"  --scheduler-step N     learning-rate scheduler position (default: the step)\n"
	"  --yaml                 write YAML instead of binary\n"
	"  --lost RANKS|DEVICES   these ranks of A (0,3,5-7), or the devices of a devices file,\n"
	"                         are gone: plan only from the survivors; what none holds is\n"
	"                         listed on standard output and the plan refused (exit 3)\n"
	"  --allow-loss           with --lost: plan around what no survivor holds (recorded in\n"
	"                         the plan as lost ranges, for the trainer to reload)\n"
	"  --transfers            what rank R sends, receives and retains, one record a line; from\n"
	"                         A B (rank R's plan), or a plan or staged plan file PLAN\n"
	"  --peer P               with --transfers: only those to or from world rank P\n"
	"  --tensor NAME|GLOB     with --transfers: only those of the tensor(s)\n"
	"  --state S              with --transfers: only those of state S\n"
	"  --stage N              with --transfers of a staged plan: only stage N\n"
	"  --format F             with --transfers or --lost: yaml (default), tsv or json\n"
	"  -o, --output FILE      write FILE (through a temporary and a rename)\n"
	"  -h, --help             this text\n"
	"  --version              the version\n";

struct rank_totals {
	int64_t send, recv, keep, pieces;
};

static struct rank_totals rank_totals(const struct vps_plan *p, int64_t r)
{
	struct rank_totals t = {0};
	for (size_t i = 0; i < p->npieces; i++) {
		const struct vps_piece *x = &p->pieces[i];
		int64_t b = vps_piece_bytes(x);
		t.pieces++;
		if (x->src == x->dst)
			t.keep += b;
		else if (x->src == r)
			t.send += b;
		else
			t.recv += b;
	}
	return t;
}

static void print_rank_stats(const struct vps_plan *p, int64_t r, bool h)
{
	struct rank_totals t = rank_totals(p, r);
	char n[TOOL_NUM];
	printf("rank: %" PRId64 "\n", r);
	printf("world: %" PRId64 "\n", vps_world_size(p->world));
	printf("a_rank: %" PRId64 "\n", vps_world_a_rank(p->world, r));
	printf("b_rank: %" PRId64 "\n", vps_world_b_rank(p->world, r));
	printf("pieces: %" PRId64 "\n", t.pieces);
	printf("send_bytes: %s\n", tool_bytes(t.send, h, n, sizeof(n)));
	printf("recv_bytes: %s\n", tool_bytes(t.recv, h, n, sizeof(n)));
	printf("retained_bytes: %s\n", tool_bytes(t.keep, h, n, sizeof(n)));
}

static void print_stats(const struct vps_plan *p, const struct vps_plan_stats *s, const struct vps_topology *topo,
			const struct vps_transition *tr, bool h)
{
	char a[256], b[256], n[TOOL_NUM];
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
	printf("bytes_moved: %s\n", tool_bytes(s->bytes_moved, h, n, sizeof(n)));
	printf("bytes_retained: %s\n", tool_bytes(s->bytes_retained, h, n, sizeof(n)));
	printf("bytes_lower_bound: %s\n", tool_bytes(s->bytes_lower_bound, h, n, sizeof(n)));
	printf("moved_over_lower_bound: %.3f\n",
	       s->bytes_lower_bound ? (double)s->bytes_moved / (double)s->bytes_lower_bound : 1.0);
	printf("bytes_intra_node: %s\n", tool_bytes(s->bytes_intra_node, h, n, sizeof(n)));
	printf("bytes_inter_node: %s\n", tool_bytes(s->bytes_inter_node, h, n, sizeof(n)));
	printf("max_send_bytes: %s\n", tool_bytes(s->max_send_bytes, h, n, sizeof(n)));
	printf("max_recv_bytes: %s\n", tool_bytes(s->max_recv_bytes, h, n, sizeof(n)));
	printf("balanced_send_bound: %s\n", tool_bytes(s->balanced_send_bound, h, n, sizeof(n)));
	printf("balanced_bound: %s\n", tool_bytes(s->balanced_bound, h, n, sizeof(n)));
	printf("send_over_bound: %.3f\n",
	       s->balanced_send_bound ? (double)s->max_send_bytes / (double)s->balanced_send_bound : 1.0);
	printf("busiest_over_bound: %.3f\n",
	       s->balanced_bound ? (double)(s->max_send_bytes > s->max_recv_bytes ? s->max_send_bytes : s->max_recv_bytes) /
					   (double)s->balanced_bound
				 : 1.0);
	printf("peers_max: %" PRId64 "\n", s->peers_max);
	if (p->lost.nranks) {
		printf("lost_ranks: [");
		for (size_t i = 0; i < p->lost.nranks; i++)
			printf("%s%" PRId64, i ? ", " : "", p->lost.ranks[i]);
		printf("]\n");
		printf("lost_ranges: %zu\n", p->lost.nranges);
		printf("lost_bytes: %s\n", tool_bytes(vps_lost_bytes(&p->lost), h, n, sizeof(n)));
	}
	printf("collectives: %zu\n", p->ncolls);
	if (topo) {
		printf("topology: %s\n", topo->name);
		printf("estimate_seconds: %s\n", tool_seconds(s->estimate_seconds, "%.4f", h, n, sizeof(n)));
		printf("time_bound_seconds: %s\n", tool_seconds(s->time_bound_seconds, "%.4f", h, n, sizeof(n)));
		printf("estimate_over_time_bound: %.3f\n",
		       s->time_bound_seconds > 0 ? s->estimate_seconds / s->time_bound_seconds : 1.0);
		printf("time_floor_seconds: %s\n", tool_seconds(s->time_floor_seconds, "%.4f", h, n, sizeof(n)));
		printf("estimate_over_time_floor: %.3f\n",
		       s->time_floor_seconds > 0 ? s->estimate_seconds / s->time_floor_seconds : 1.0);
	}
	if (tr && tr->paper_seconds > 0)
		printf("paper_seconds: %s\n", tool_seconds(tr->paper_seconds, "%.3f", h, n, sizeof(n)));
	if (tr && tr->paper_mcp_save_seconds > 0) {
		printf("paper_mcp_save_seconds: %s\n", tool_seconds(tr->paper_mcp_save_seconds, "%.3f", h, n, sizeof(n)));
		printf("paper_mcp_load_seconds: %s\n", tool_seconds(tr->paper_mcp_load_seconds, "%.3f", h, n, sizeof(n)));
	}
	if (tr && tr->paper_hotspa_seconds > 0)
		printf("paper_hotspa_seconds: %s\n", tool_seconds(tr->paper_hotspa_seconds, "%.3f", h, n, sizeof(n)));
	if (s->send) {
		printf("load:\n");
		for (int64_t w = 0; w < s->world; w++) {
			char r[TOOL_NUM];
			printf("  - {rank: %" PRId64 ", send: %s, recv: %s}\n", w, tool_bytes(s->send[w], h, n, sizeof(n)),
			       tool_bytes(s->recv[w], h, r, sizeof(r)));
		}
	}
}

/* The summary line (stderr): what a plan moves against its bounds. */
static void print_summary(const struct vps_plan *p, const struct vps_plan_stats *s, const struct vps_topology *topo)
{
	char a[VPS_UNITS_LEN], b[VPS_UNITS_LEN], c[VPS_UNITS_LEN];
	if (p->lost.nranks)
		fprintf(stderr, "plan: %zu lost rank%s; %zu ranges (%s) no survivor holds are left for the trainer to reload\n",
			p->lost.nranks, p->lost.nranks == 1 ? "" : "s", p->lost.nranges,
			vps_format_bytes(vps_lost_bytes(&p->lost), a, sizeof(a)));
	if (p->scope >= 0) {
		struct rank_totals t = rank_totals(p, p->scope);
		fprintf(stderr, "plan: rank %" PRId64 " sends %s, receives %s, keeps %s in place (%" PRId64 " pieces)\n",
			p->scope, vps_format_bytes(t.send, a, sizeof(a)), vps_format_bytes(t.recv, b, sizeof(b)),
			vps_format_bytes(t.keep, c, sizeof(c)), t.pieces);
		return;
	}
	if (!s->bytes_moved) {
		fprintf(stderr, "plan: nothing moves; %s stays in place\n", vps_format_bytes(s->bytes_retained, a, sizeof(a)));
		return;
	}
	int64_t busiest = s->max_send_bytes > s->max_recv_bytes ? s->max_send_bytes : s->max_recv_bytes;
	fprintf(stderr, "plan: %s moved, ", vps_format_bytes(s->bytes_moved, a, sizeof(a)));
	if (s->bytes_moved == s->bytes_lower_bound)
		fprintf(stderr, "the lower bound");
	else
		fprintf(stderr, "%.2fx the lower bound",
			s->bytes_lower_bound ? (double)s->bytes_moved / (double)s->bytes_lower_bound : 1.0);
	fprintf(stderr, "; busiest device %s (%.2fx balanced)", vps_format_bytes(busiest, b, sizeof(b)),
		s->balanced_bound ? (double)busiest / (double)s->balanced_bound : 1.0);
	if (topo)
		fprintf(stderr, "; %s on %s", vps_format_seconds(s->estimate_seconds, c, sizeof(c)), topo->name);
	fputc('\n', stderr);
}

static bool num(const char *flag, const char *s, int64_t *v)
{
	if (tool_parse_i64(s, v))
		return true;
	tool_usage_error("%s: '%s' is not a non-negative integer", flag, s);
	return false;
}

/* --lost: ranks of A as a list (0,3,5-7), or the devices of a devices
 * document. 0, or the exit status of bad input. */
static int lost_ranks(const char *arg, const struct vps_layout *a, int64_t **ranks, size_t *n)
{
	size_t cap = 0;
	bool all = false;
	if (*arg && strspn(arg, "0123456789,-") == strlen(arg)) {
		if (!tool_parse_ranks(arg, ranks, n, &cap, &all) || all)
			return tool_usage_error("--lost: '%s' is not a list of ranks (0,3,5-7)", arg);
		return 0;
	}
	vps_result_t rc = vps_lost_devices(a, arg, ranks, n);
	return rc ? tool_fail(rc) : 0;
}

/* What no survivor holds, as records on standard output, and the refusal. */
static int refuse_lost(const struct vps_lost *l, const struct vps_layout *a, enum vps_format format)
{
	struct vps_bytes list = {0};
	char b[VPS_UNITS_LEN];
	vps_result_t rc = vps_lost_format(l, a, format, &list);
	if (!rc)
		rc = vps_write_output(NULL, &list, false);
	vps_bytes_release(&list);
	if (rc)
		return tool_fail(rc);
	fprintf(stderr,
		"%s: %zu ranges (%s) of the source are held by no surviving rank (listed): refused; --allow-loss plans "
		"around them and the trainer reloads them\n",
		tool_name, l->nranges, vps_format_bytes(vps_lost_bytes(l), b, sizeof(b)));
	return tool_finish(EXIT_LOST);
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
		{"svg", required_argument, NULL, 'W'},          {"human", no_argument, NULL, 'H'},
		{"quiet", no_argument, NULL, 'q'},              {"lost", required_argument, NULL, 'x'},
		{"allow-loss", no_argument, NULL, 'A'},         {0, 0, 0, 0}};
	const char *out = NULL, *topo_arg = NULL, *transition = NULL, *svg = NULL;
	bool stats = false, load = false, yaml = false, human = false, quiet = false;
	struct vps_plan_opts po = {.rank = -1};
	bool have_step = false, have_consumed = false, have_sched = false;
	int c, status = EXIT_USAGE;
	struct vps_query q;
	enum vps_format format = VPS_FORMAT_YAML;
	bool transfers = false, query_flags = false, allow_loss = false, have_format = false;
	const char *lost_arg = NULL;
	vps_query_init(&q);
	while ((c = getopt_long(argc, argv, "hHqo:", opts, NULL)) != -1) {
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
		case 'W': svg = optarg; break;
		case 'H': human = true; break;
		case 'q': quiet = true; break;
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
		case 'x': lost_arg = optarg; break;
		case 'A': allow_loss = true; break;
		case 'P':
		case 'N':
		case 'Q':
		case 'g':
		case 'F':
			query_flags |= c != 'F';
			have_format |= c == 'F';
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
	if ((query_flags || (have_format && !lost_arg)) && !transfers)
		return tool_usage_error("--peer, --tensor, --state, --stage and --format go with --transfers");
	if (allow_loss && !lost_arg)
		return tool_usage_error("--allow-loss goes with --lost");
	if (lost_arg && transfers && argc - optind == 1)
		return tool_usage_error("--lost plans: it goes with two layouts or a transition, not a plan file");
	if (transfers && (stats || yaml || svg))
		return tool_usage_error("--transfers is a query: --stats, --yaml and --svg do not apply (--format yaml)");
	q.rank = po.rank;
	if (transfers && !transition && argc - optind == 1)
		return query_file(argv[optind], &q, format, out);
	if (transfers && po.rank < 0)
		return tool_usage_error("--transfers needs --rank R with two layouts or a transition");
	if (transition ? argc != optind : argc - optind != 2)
		return tool_usage_error("expected two layouts or --transition NAME\n%s", usage);
	if (load && !stats)
		return tool_usage_error("--load goes with --stats");
	if (svg && po.rank >= 0)
		return tool_usage_error("--svg draws a global plan's traffic: it does not go with --rank");
	if (svg && out && !strcmp(svg, out))
		return tool_usage_error("--svg and -o name the same file '%s'", svg);
	/* the plan is written unless only statistics or a picture are asked for */
	bool write_plan = !stats && (!svg || out);
	bool summary = !stats && tool_summary_wanted(quiet, write_plan ? out : svg);
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
	struct vps_bytes bytes = {0}, pic = {0};
	struct vps_plan_stats s = {0};
	int64_t *lost = NULL;
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
	if (lost_arg) {
		struct vps_lost l;
		size_t nlost = 0;
		if ((status = lost_ranks(lost_arg, a, &lost, &nlost)))
			goto done;
		if ((rc = vps_lost_compute(&l, a, lost, nlost)))
			goto fail;
		if ((rc = vps_lost_check_target(&l, a, b))) {
			vps_lost_release(&l);
			goto fail;
		}
		if (l.nranges && !allow_loss) {
			status = refuse_lost(&l, a, format);
			vps_lost_release(&l);
			goto done;
		}
		vps_lost_release(&l);
		po.lost = lost;
		po.nlost = nlost;
		po.allow_loss = true;
	}
	/* the tool only hashes, writes or counts a global plan's pieces */
	po.compact = true;
	po.unhashed = !write_plan;
	if ((rc = vps_plan_compute(&p, a, b, &po)))
		goto fail;
	a = b = NULL;
	if (transfers) {
		if ((rc = vps_query_transfers(p, &q, format, &bytes)) || (rc = vps_write_output(out, &bytes, false)))
			goto fail;
		status = tool_finish(EXIT_OK);
		goto done;
	}
	/* all computed before a file is written: bad input writes nothing */
	if ((stats || summary) && po.rank < 0 && (rc = vps_plan_stats(p, topo_arg ? &topo : NULL, load, &s)))
		goto fail;
	if (svg && (rc = vps_plan_svg(p, tr.name[0] ? tr.name : NULL, &pic)))
		goto fail;
	if (write_plan && (rc = vps_plan_serialize(p, yaml, &bytes)))
		goto fail;
	if ((write_plan && (rc = vps_write_output(out, &bytes, !yaml))) || (svg && (rc = vps_write_output(svg, &pic, false))))
		goto fail;
	if (stats) {
		if (po.rank >= 0)
			print_rank_stats(p, po.rank, tool_human(human));
		else
			print_stats(p, &s, topo_arg ? &topo : NULL, &tr, tool_human(human));
		status = tool_finish(EXIT_OK);
		goto done;
	}
	status = tool_finish(EXIT_OK);
	if (summary && !status)
		print_summary(p, &s, topo_arg ? &topo : NULL);
	goto done;
fail:
	status = tool_fail(rc);
done:
	free(lost);
	vps_plan_stats_release(&s);
	vps_bytes_release(&bytes);
	vps_bytes_release(&pic);
	vps_plan_free(p);
	vps_layout_free(a);
	vps_layout_free(b);
	return status;
}
