/* vps-plan: which bytes move from which device to which. */
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
	"                [--svg FILE] [--relay[=never|auto|always] | --no-relay] [-H] [-q]\n"
	"                [--global-batch N [--micro-batch N] [--micro-batch-before N]]\n"
	"                [--step N] [--consumed-samples N] [--scheduler-step N]\n"
	"                [--lost RANKS|DEVICES [--allow-loss] [--format yaml|tsv|json]]\n"
	"                (A B | --transition NAME)\n"
	"       vps-plan --transfers [--rank R] [--peer P] [--tensor NAME|GLOB] [--state S]\n"
	"                [--stage N] [--format yaml|tsv|json] [-o FILE] (A B | --transition NAME | PLAN)\n"
	"       vps-plan --transition list\n"
	"       vps-plan -h | --version\n"
	"options:\n"
	"  --transition NAME      plan a transition of configs/transitions (or a file);\n"
	"                         list: name each, with its description\n"
	"  --rank R               only world rank R's part: its sends, receives and retains\n"
	"  --threads N            threads for a global plan (default: the online CPUs)\n"
	"  --stats                print statistics as YAML instead of the plan\n"
	"  --load                 with --stats: bytes each rank sends and receives\n"
	"  --topology T           estimate the time on a topology (--stats and the summary)\n"
	"  --svg FILE             draw the traffic (heatmap and per-rank bars) as SVG in FILE;\n"
	"                         the plan is written too only with -o\n"
	"  -H, --human            --stats in KiB, MiB, GiB (seconds in 3 digits) even when not\n"
	"                         on a terminal\n"
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
	"  --relay[=MODE]         where receivers pass on to each other what a holder sent them\n"
	"                         once (docs/relay.md): auto (the default) where that makes a\n"
	"                         region's busiest sender faster on --topology, or else sends\n"
	"                         fewer bytes (devices of A only where none ends busier than a\n"
	"                         holder); always (--relay alone) where joining ones outnumber\n"
	"                         its holders; never\n"
	"  --no-relay             --relay=never: the plan of vps before relays\n"
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

/* What sets the time floor, in words: where to look when a plan is far
 * from it, or when the floor itself is the problem. */
static void print_floor_by(const struct vps_time_floor *f)
{
	int node = f->device.node, gpu = f->device.gpu;
	switch (f->by) {
	case VPS_FLOOR_RECEIVER:
		printf("time_floor_by: \"the receives of node %d gpu %d\"\n", node, gpu);
		break;
	case VPS_FLOOR_SENDERS:
		if (f->senders > 1)
			printf("time_floor_by: \"the sends of the %" PRId64 " holders from node %d gpu %d\"\n", f->senders,
			       node, gpu);
		else
			printf("time_floor_by: \"the sends of node %d gpu %d\"\n", node, gpu);
		break;
	case VPS_FLOOR_NODE_IN:
		printf("time_floor_by: \"what enters node %d, over its NICs\"\n", node);
		break;
	case VPS_FLOOR_NODE_OUT:
		printf("time_floor_by: \"what leaves node %d, over its NICs\"\n", node);
		break;
	case VPS_FLOOR_NODES_OUT:
		printf("time_floor_by: \"what the nodes of %" PRId64 " NICs from node %d send, entering each other and "
		       "leaving, over their NICs\"\n",
		       f->senders, node);
		break;
	}
}

/* What sets the estimate, in words: the device to look at first when a
 * plan is slower than its floor. */
static void print_estimate_by(const struct vps_estimate *e, bool h)
{
	static const char *const what[] = {"its sends over NVLink", "its receives over NVLink", "its sends over its NICs",
					   "its receives over its NICs", "its local copies"};
	char n[TOOL_NUM];
	printf("estimate_by: \"world rank %" PRId64 " (node %d gpu %d): %s, %s, and %" PRId64 " peer%s\"\n", e->rank,
	       e->device.node, e->device.gpu, what[e->by], tool_bytes(e->bytes, h, n, sizeof(n)), e->peers,
	       e->peers == 1 ? "" : "s");
}

static const char *relay_name(uint8_t mode)
{
	return mode == VPS_RELAY_AUTO ? "auto" : mode == VPS_RELAY_ALWAYS ? "always" : "never";
}

static void print_stats(const struct vps_plan *p, const struct vps_plan_stats *s, const struct vps_topology *topo,
			double relayed_floor, const struct vps_transition *tr, bool h)
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
	printf("relay: %s\n", relay_name(p->relay));
	printf("bytes_relayed: %s\n", tool_bytes(s->bytes_relayed, h, n, sizeof(n)));
	printf("bytes_transit: %s\n", tool_bytes(s->bytes_transit, h, n, sizeof(n)));
	printf("max_send_over_max_recv: %.3f\n",
	       s->max_recv_bytes ? (double)s->max_send_bytes / (double)s->max_recv_bytes : 0.0);
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
		if (s->world)
			print_estimate_by(&s->estimate, h);
		printf("time_bound_seconds: %s\n", tool_seconds(s->time_bound_seconds, "%.4f", h, n, sizeof(n)));
		printf("estimate_over_time_bound: %.3f\n",
		       s->time_bound_seconds > 0 ? s->estimate_seconds / s->time_bound_seconds : 1.0);
		printf("time_floor_seconds: %s\n", tool_seconds(s->time_floor_seconds, "%.4f", h, n, sizeof(n)));
		if (s->time_floor_seconds > 0)
			print_floor_by(&s->time_floor);
		printf("estimate_over_time_floor: %.3f\n",
		       s->time_floor_seconds > 0 ? s->estimate_seconds / s->time_floor_seconds : 1.0);
		printf("relayed_time_floor_seconds: %s\n", tool_seconds(relayed_floor, "%.4f", h, n, sizeof(n)));
		printf("estimate_over_relayed_time_floor: %.3f\n",
		       relayed_floor > 0 ? s->estimate_seconds / relayed_floor : 1.0);
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
			char r[TOOL_NUM], ns[TOOL_NUM], nr[TOOL_NUM], k[TOOL_NUM], t[TOOL_NUM];
			printf("  - {rank: %" PRId64 ", send: %s, recv: %s, nic_send: %s, nic_recv: %s, retain: %s", w,
			       tool_bytes(s->send[w], h, n, sizeof(n)), tool_bytes(s->recv[w], h, r, sizeof(r)),
			       tool_bytes(s->nic_send[w], h, ns, sizeof(ns)), tool_bytes(s->nic_recv[w], h, nr, sizeof(nr)),
			       tool_bytes(s->retain[w], h, k, sizeof(k)));
			if (s->seconds)
				printf(", seconds: %s", tool_seconds(s->seconds[w], "%.4f", h, t, sizeof(t)));
			printf("}\n");
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
	/* devices that change make a reshard a migration: say so (two layouts
	 * of 8 ranks, 8 GPUs a node against 4, are not the same devices) */
	if (s->joining || s->leaving)
		fprintf(stderr, "; %" PRId64 " joining, %" PRId64 " leaving", s->joining, s->leaving);
	fputc('\n', stderr);
}

/* What the command line asks for. */
struct plan_args {
	struct vps_plan_opts po;
	struct vps_query q;
	const char *topology, *transition, *svg, *lost;
	int64_t threads;
	bool stats, load, transfers, allow_loss, no_relay;
};

/* --relay[=never|auto|always]: alone, always (what --relay did before
 * relays were chosen by default). */
static bool relay_mode(const char *arg, void *value, char *why, size_t n)
{
	static const struct {
		const char *name;
		enum vps_relay mode;
	} modes[] = {{"never", VPS_RELAY_NEVER}, {"auto", VPS_RELAY_AUTO}, {"always", VPS_RELAY_ALWAYS}};
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
		if (!arg || !strcmp(arg, modes[i].name)) {
			*(enum vps_relay *)value = arg ? modes[i].mode : VPS_RELAY_ALWAYS;
			return true;
		}
	snprintf(why, n, "'%s' is none of never, auto and always", arg);
	return false;
}

/* --lost: ranks of A as a list (0,3,5-7), or the devices of a devices
 * document. 0, or the exit status of the error printed. */
static int lost_ranks(const char *arg, const struct vps_layout *a, int64_t **ranks, size_t *n)
{
	if (*arg && strspn(arg, "0123456789,-") == strlen(arg)) {
		struct tool_ranks r = {0};
		if (!tool_parse_ranks(arg, &r)) {
			tool_ranks_release(&r);
			return tool_usage_error("--lost: '%s' is not a list of ranks (0,3,5-7)", arg);
		}
		*ranks = r.list;
		*n = r.n;
		return 0;
	}
	vps_result_t rc = vps_lost_devices(a, arg, ranks, n);
	return rc ? tool_fail_at("--lost", rc) : 0;
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

/* --lost: plan from the survivors, or refuse what none of them holds.
 * 0, or the exit status of the error or refusal printed. */
static int plan_lost(struct plan_args *a, enum vps_format format, const struct vps_layout *la,
		     const struct vps_layout *lb, int64_t **lost)
{
	struct vps_lost l;
	size_t n = 0;
	int status = lost_ranks(a->lost, la, lost, &n);
	vps_result_t rc;
	if (status)
		return status;
	if ((rc = vps_lost_compute(&l, la, *lost, n)))
		return tool_fail_at("--lost", rc);
	if ((rc = vps_lost_check_target(&l, la, lb)))
		status = tool_fail_at("--lost", rc);
	else if (l.nranges && !a->allow_loss)
		status = refuse_lost(&l, la, format);
	vps_lost_release(&l);
	if (status)
		return status;
	a->po.lost = *lost;
	a->po.nlost = n;
	a->po.allow_loss = true;
	return 0;
}

/* The two layouts: of the transition, or of the files named. */
static vps_result_t load_layouts(const struct plan_args *a, char **operands, struct vps_transition *tr,
				 struct vps_layout **la, struct vps_layout **lb)
{
	vps_result_t rc;
	if (a->transition) {
		char tp[4096], mp[4096], pp[4096];
		snprintf(tp, sizeof(tp), "%s", tool_config_path("transitions"));
		snprintf(mp, sizeof(mp), "%s", tool_config_path("models"));
		snprintf(pp, sizeof(pp), "%s", tool_config_path("parallel"));
		return vps_transition_load(a->transition, tp, mp, pp, tr, la, lb);
	}
	if ((rc = vps_layout_load(la, operands[0])))
		return rc;
	return vps_layout_load(lb, operands[1]);
}

/* Whether the plan itself is written: unless only statistics or a picture are asked for. */
static bool writes_plan(const struct plan_args *a, const struct tool_common *c)
{
	return !a->stats && (!a->svg || c->out);
}

/* The plan, its statistics, its picture and its summary line, as asked. */
static int write_outputs(const struct vps_plan *p, const struct plan_args *a, const struct tool_common *c,
			 const struct vps_topology *topo, const struct vps_transition *tr)
{
	bool plan = writes_plan(a, c);
	bool summary = !a->stats && tool_summary_wanted(c->quiet, plan ? c->out : a->svg);
	struct vps_bytes bytes = {0}, pic = {0};
	struct vps_plan_stats s = {0};
	struct vps_time_floor relayed = {0};
	vps_result_t rc = VPS_OK;
	int status;
	/* all computed before a file is written: bad input writes nothing */
	if ((a->stats || summary) && a->po.rank < 0)
		rc = vps_plan_stats(p, topo, a->load, &s);
	/* what no plan that relays can beat: the floor of a plan that does */
	if (!rc && a->stats && a->po.rank < 0 && topo && s.bytes_relayed)
		relayed = s.time_floor;
	else if (!rc && a->stats && a->po.rank < 0 && topo)
		rc = vps_time_floor_relayed(p->a, p->b, topo, &relayed);
	if (!rc && a->svg)
		rc = vps_plan_svg(p, tr->name[0] ? tr->name : NULL, &pic);
	if (!rc && plan)
		rc = vps_plan_serialize(p, c->yaml, &bytes);
	if (!rc && plan)
		rc = vps_write_output(c->out, &bytes, !c->yaml);
	if (!rc && a->svg)
		rc = vps_write_output(a->svg, &pic, false);
	if (!rc && a->stats && a->po.rank >= 0)
		print_rank_stats(p, a->po.rank, tool_human(c->human));
	else if (!rc && a->stats)
		print_stats(p, &s, topo, relayed.seconds, tr, tool_human(c->human));
	status = rc ? tool_fail(rc) : tool_finish(EXIT_OK);
	if (summary && !status)
		print_summary(p, &s, topo);
	vps_plan_stats_release(&s);
	vps_bytes_release(&bytes);
	vps_bytes_release(&pic);
	return status;
}

/* --transfers of the plan computed. */
static int query_plan(const struct vps_plan *p, const struct vps_query *q, const struct tool_common *c)
{
	struct vps_bytes bytes = {0};
	vps_result_t rc = vps_query_transfers(p, q, c->format, &bytes);
	if (!rc)
		rc = vps_write_output(c->out, &bytes, false);
	vps_bytes_release(&bytes);
	return rc ? tool_fail(rc) : tool_finish(EXIT_OK);
}

/* Plan A -> B and write what was asked for. */
static int plan(struct plan_args *a, const struct tool_cli *cli)
{
	struct vps_layout *la = NULL, *lb = NULL;
	struct vps_plan *p = NULL;
	struct vps_topology topo;
	struct vps_transition tr = {0};
	int64_t *lost = NULL;
	vps_result_t rc;
	int status;
	if (a->topology && (rc = vps_topology_load(&topo, a->topology, tool_config_path("topologies")))) {
		status = tool_fail_lookup("--topology", rc);
		goto done;
	}
	if ((rc = load_layouts(a, cli->operands, &tr, &la, &lb))) {
		status = a->transition ? tool_fail_lookup("--transition", rc) : tool_fail(rc);
		goto done;
	}
	if (a->lost && (status = plan_lost(a, cli->common.format, la, lb, &lost)))
		goto done;
	/* relays chosen by estimate weigh the topology asked for */
	if (a->topology)
		a->po.topology = &topo;
	/* the tool only hashes, writes or counts a global plan's pieces */
	a->po.compact = true;
	a->po.unhashed = !writes_plan(a, &cli->common);
	if ((rc = vps_plan_compute(&p, la, lb, &a->po)))
		goto fail;
	la = lb = NULL;
	if (a->transfers)
		status = query_plan(p, &a->q, &cli->common);
	else
		status = write_outputs(p, a, &cli->common, a->topology ? &topo : NULL, &tr);
	goto done;
fail:
	status = tool_fail(rc);
done:
	free(lost);
	vps_plan_free(p);
	vps_layout_free(la);
	vps_layout_free(lb);
	return status;
}

/* --transition list: the transitions --transition NAME takes, one a line,
 * with their descriptions. */
static int list_transitions(const struct tool_cli *cli)
{
	size_t given = 0, n, width = 0;
	for (size_t i = 0; cli->options[i].name; i++)
		given += cli->given[i];
	if (given > 1 || cli->common.given || cli->noperands)
		return tool_usage_error("--transition list lists the transitions: no other options or operands with it");
	struct vps_transition *t;
	vps_result_t rc = vps_transition_list(tool_config_path("transitions"), &t, &n);
	if (rc)
		return tool_fail(rc);
	for (size_t i = 0; i < n; i++)
		if (strlen(t[i].name) > width)
			width = strlen(t[i].name);
	for (size_t i = 0; i < n; i++)
		printf("%-*s  %s\n", (int)width, t[i].name, t[i].description);
	free(t);
	return tool_finish(EXIT_OK);
}

/* The operands: two layouts, none with --transition, or a plan file to
 * query. TOOL_PARSED when they fit the options. */
static int check_operands(const struct plan_args *a, const struct tool_cli *cli)
{
	const char *out = cli->common.out;
	size_t n = cli->noperands;
	if (a->transfers && n == 1 && a->lost)
		return tool_usage_error("--lost plans: it goes with two layouts or a transition, not a plan file");
	if (a->transfers && n == 1 && !a->transition)
		return TOOL_PARSED;
	if (a->transfers && a->po.rank < 0)
		return tool_usage_error("--transfers needs --rank R with two layouts or a transition");
	int status = tool_operands(cli, a->transition ? 0 : 2, a->transition ? 0 : 2, "two layouts or --transition NAME");
	if (status != TOOL_PARSED)
		return status;
	if (!a->transition && !strcmp(cli->operands[0], "-") && !strcmp(cli->operands[1], "-"))
		return tool_usage_error("only one of the layouts can be standard input");
	if (a->svg && out && !strcmp(a->svg, out))
		return tool_usage_error("--svg and -o name the same file '%s'", a->svg);
	return TOOL_PARSED;
}

#define STR_(x) #x
#define STR(x) STR_(x)

int main(int argc, char **argv)
{
	struct plan_args a = {.po = VPS_PLAN_OPTS_INIT};
	struct tool_option options[] = {
		TOOL_OPT_STRING(0, "transition", &a.transition),
		TOOL_OPT_RANK("rank", &a.po.rank),
		TOOL_OPT_INT("threads", &a.threads, 1, VPS_PLAN_MAX_THREADS, "from 1 to " STR(VPS_PLAN_MAX_THREADS)),
		TOOL_OPT_BOOL(0, "stats", &a.stats),
		TOOL_OPT_BOOL(0, "load", &a.load),
		TOOL_OPT_STRING(0, "topology", &a.topology),
		TOOL_OPT_STRING(0, "svg", &a.svg),
		TOOL_OPT_COUNT("global-batch", &a.po.train.global_batch),
		TOOL_OPT_COUNT("micro-batch", &a.po.train.micro_batch),
		TOOL_OPT_COUNT("micro-batch-before", &a.po.micro_batch_a),
		TOOL_OPT_COUNT("step", &a.po.train.step),
		TOOL_OPT_COUNT("consumed-samples", &a.po.train.consumed_samples),
		TOOL_OPT_COUNT("scheduler-step", &a.po.train.scheduler_step),
		TOOL_OPT_STRING(0, "lost", &a.lost),
		TOOL_OPT_BOOL(0, "allow-loss", &a.allow_loss),
		TOOL_OPT_FUNC_OPTIONAL("relay", &a.po.relay_mode, relay_mode),
		TOOL_OPT_BOOL(0, "no-relay", &a.no_relay),
		TOOL_OPT_BOOL(0, "transfers", &a.transfers),
		TOOL_OPT_RANK("peer", &a.q.peer),
		TOOL_OPT_STRING(0, "tensor", &a.q.tensor),
		TOOL_OPT_FUNC(0, "state", &a.q.state, tool_state),
		TOOL_OPT_COUNT("stage", &a.q.stage),
		TOOL_OPT_END,
	};
	static const struct tool_rule rules[] = {
		{"peer tensor state stage", "transfers", NULL, "--peer, --tensor, --state, --stage and --format go with --transfers"},
		{"format", "transfers lost", NULL, NULL},
		{"allow-loss", "lost", NULL, NULL},
		{"no-relay", NULL, "relay", NULL},
		{"transfers", NULL, "stats yaml svg",
		 "--transfers is a query: --stats, --yaml and --svg do not apply (--format yaml)"},
		{"load", "stats", NULL, NULL},
		{"svg", NULL, "rank", "--svg draws a global plan's traffic: it does not go with --rank"},
		{"step", "consumed-samples", NULL, "--step and --consumed-samples go together (the data position is both)"},
		{"consumed-samples", "step", NULL, "--step and --consumed-samples go together (the data position is both)"},
		{"scheduler-step", "step", NULL, "--scheduler-step needs --step and --consumed-samples"},
		{"micro-batch micro-batch-before", "global-batch", NULL,
		 "--micro-batch and --micro-batch-before need --global-batch"},
		{0},
	};
	struct tool_cli cli = {.usage = usage,
			       .shared = TOOL_OUTPUT | TOOL_YAML | TOOL_HUMAN | TOOL_QUIET | TOOL_FORMAT,
			       .options = options,
			       .rules = rules};
	vps_query_init(&a.q);
	int status = tool_parse(&cli, argc, argv);
	if (status == TOOL_PARSED && a.transition && !strcmp(a.transition, "list"))
		return list_transitions(&cli);
	if (status == TOOL_PARSED)
		status = check_operands(&a, &cli);
	if (status != TOOL_PARSED)
		return status;
	a.q.rank = a.po.rank;
	if (a.no_relay)
		a.po.relay_mode = VPS_RELAY_NEVER;
	a.po.threads = (int)a.threads;
	a.po.train.known = tool_given(&cli, "step");
	if (a.po.train.known && !tool_given(&cli, "scheduler-step"))
		a.po.train.scheduler_step = a.po.train.step;
	if (a.transfers && !a.transition && cli.noperands == 1)
		return query_file(cli.operands[0], &a.q, cli.common.format, cli.common.out);
	return plan(&a, &cli);
}
