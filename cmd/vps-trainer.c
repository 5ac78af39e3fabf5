/* vps-trainer: the reference trainer, for tests and demos. */
#include <getopt.h>
#include <pthread.h>
#include <inttypes.h>
#include <signal.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "launcher.h"
#include "vps/registry.h"
#include "vps/trainer.h"

const char *tool_name = "vps-trainer";

static const char usage[] =
	"usage: vps-trainer [--registry NAME] [--rank R] [--local-rank L] [--steps N] [--steps-after M]\n"
	"                   [--global-batch G] [--micro-batch B] [--samples FILE] [--timeout S]\n"
	"                   [--cuda [--device N]]\n"
	"                   STAGED...\n"
	"       vps-trainer -h | --version\n"
	"options:\n"
	"  --registry NAME     registry to create (default vps-%j-%r; %j the job (its staging), %r world\n"
	"                      rank, %a source rank, %b target rank, %l local rank, %% a percent sign)\n"
	"  --rank R            world rank (default: RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK)\n"
	"  --local-rank L      rank on this node (default: LOCAL_RANK, SLURM_LOCALID, ...)\n"
	"  --steps N           optimizer steps before the first switch (default 3)\n"
	"  --steps-after M     steps after each switch (default 2)\n"
	"  --global-batch G    samples per step (default 0: no data loader)\n"
	"  --micro-batch B     micro batch under the first layout (default 1)\n"
	"  --samples FILE      append every sample id this rank reads\n"
	"  --timeout S         seconds to wait for each switch (default 120)\n"
	"  --cuda              hold the state in GPU memory, registered by device pointer\n"
	"  --device N          that GPU (default: the local rank modulo the visible GPUs)\n"
	"  -h, --help          this text\n"
	"  --version           the version\n";

static char registry_to_remove[VPS_REGISTRY_NAME_MAX + 1];
static sigset_t termination;

/* SIGTERM, SIGINT, SIGHUP: remove the registry and exit. A thread that
 * waits for them, not a handler: the clean-up scans /dev/shm and
 * allocates, which a handler must not do (a handler that did deadlocked a
 * trainer that was killed inside malloc, or inside the sanitizer's exit
 * leak check). */
static void *reaper(void *unused)
{
	(void)unused;
	int sig;
	if (sigwait(&termination, &sig) != 0)
		return NULL;
	vps_registry_unlink(registry_to_remove);
	_exit(128 + sig);
}

static void say(void *ctx, const char *message)
{
	fprintf(stderr, "vps-trainer: rank %" PRId64 ": %s\n", *(const int64_t *)ctx, message);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"registry", required_argument, NULL, 'R'},   {"rank", required_argument, NULL, 'r'},
		{"local-rank", required_argument, NULL, 'l'},
		{"steps", required_argument, NULL, 's'},      {"steps-after", required_argument, NULL, 'a'},
		{"global-batch", required_argument, NULL, 'g'}, {"micro-batch", required_argument, NULL, 'b'},
		{"samples", required_argument, NULL, 'L'},    {"timeout", required_argument, NULL, 't'},
		{"cuda", no_argument, NULL, 'C'},             {"device", required_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},             {"version", no_argument, NULL, 'V'},
		{0, 0, 0, 0}};
	struct launch l = {-1, -1, -1, "", 0, NULL};
	struct vps_trainer_opts o = {0};
	const char *pattern = VPS_REGISTRY_DEFAULT;
	int c;
	o.steps_before = 3;
	o.steps_after = 2;
	o.micro_batch = 1;
	o.timeout = 120;
	o.device = -1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		int64_t v;
		switch (c) {
		case 'R': pattern = optarg; break;
		case 'r':
			if (!tool_parse_i64(optarg, &l.rank))
				return tool_usage_error("--rank: '%s' is not a rank", optarg);
			break;
		case 'l':
			if (!tool_parse_i64(optarg, &l.local_rank))
				return tool_usage_error("--local-rank: '%s' is not a rank", optarg);
			break;
		case 's':
		case 'a':
		case 'g':
		case 'b':
			if (!tool_parse_i64(optarg, &v))
				return tool_usage_error("--%s: '%s' is not a non-negative integer",
							c == 's' ? "steps" : c == 'a' ? "steps-after" : c == 'g' ? "global-batch"
														   : "micro-batch",
							optarg);
			if (c == 's')
				o.steps_before = v;
			else if (c == 'a')
				o.steps_after = v;
			else if (c == 'g')
				o.global_batch = v;
			else
				o.micro_batch = v;
			break;
		case 'L': o.samples_log = optarg; break;
		case 'C': o.cuda = true; break;
		case 'D':
			if (!tool_parse_i64(optarg, &v) || v < 0 || v > 1023)
				return tool_usage_error("--device: '%s' is not a GPU number", optarg);
			o.device = (int)v;
			break;
		case 't': {
			char *end;
			o.timeout = strtod(optarg, &end);
			if (*end || o.timeout <= 0)
				return tool_usage_error("--timeout: '%s' is not a positive number of seconds", optarg);
			break;
		}
		case 'h': fputs(usage, stdout); return tool_finish(EXIT_OK);
		case 'V': printf("vps-trainer %s\n", VPS_VERSION_STRING); return tool_finish(EXIT_OK);
		default: fputs(usage, stderr); return EXIT_USAGE;
		}
	}
	size_t nplans = (size_t)(argc - optind);
	if (!nplans)
		return tool_usage_error("expected a staged plan\n%s", usage);
	int st = launch_resolve(&l, false);
	if (st)
		return st;
	o.rank = l.rank;
	o.local_rank = l.local_rank;
	o.notice = say;
	o.notice_ctx = &l.rank;
	o.plan_names = (const char *const *)&argv[optind];
	struct vps_staged **plans = calloc(nplans, sizeof(*plans));
	vps_result_t rc = plans ? VPS_OK : VPS_ENOMEM;
	int status;
	for (size_t i = 0; i < nplans && !rc; i++)
		rc = vps_staged_load(&plans[i], argv[optind + (int)i]);
	/* the job's tag is its first plan's, as vps-exec computes it */
	char name[VPS_REGISTRY_NAME_MAX + 1];
	if (!rc) {
		const struct vps_world *w = plans[0]->plan->world;
		struct vps_registry_name_parts parts = {vps_staged_world_hash(plans[0]), l.rank, vps_world_a_rank(w, l.rank),
							vps_world_b_rank(w, l.rank), l.local_rank};
		rc = vps_registry_expand(pattern, &parts, name, sizeof(name));
	}
	o.registry = name;
	/* killed while it holds shared memory: remove it */
	snprintf(registry_to_remove, sizeof(registry_to_remove), "%s", rc ? "" : name);
	sigemptyset(&termination);
	sigaddset(&termination, SIGTERM);
	sigaddset(&termination, SIGINT);
	sigaddset(&termination, SIGHUP);
	pthread_t reaper_thread;
	if (pthread_sigmask(SIG_BLOCK, &termination, NULL) != 0 ||
	    pthread_create(&reaper_thread, NULL, reaper, NULL) != 0) {
		status = tool_usage_error("cannot start the signal thread");
		goto done;
	}
	pthread_detach(reaper_thread);
	struct vps_trainer_result res;
	if (!rc)
		rc = vps_trainer_run(plans, nplans, &o, &res);
	if (rc) {
		fprintf(stderr, "vps-trainer: rank %" PRId64 ": %s\n", l.rank, *vps_last_error() ? vps_last_error() : vps_strerror(rc));
		status = tool_status(rc);
	} else {
		bool ok = !res.wrong_elements && !res.dirty_padding && res.training_state_ok;
		printf("vps-trainer: rank %" PRId64 ": %" PRId64 " switch%s, step %" PRId64 ", %" PRId64
		       " samples; %" PRId64 " wrong elements, %" PRId64 " dirty padding, training state %s: %s\n",
		       l.rank, res.switches, res.switches == 1 ? "" : "es", res.step, res.consumed_samples, res.wrong_elements, res.dirty_padding,
		       res.training_state_ok ? "carried" : "LOST", ok ? "ok" : "FAILED");
		status = tool_finish(ok ? EXIT_OK : EXIT_CHECK);
	}
done:
	for (size_t i = 0; plans && i < nplans; i++)
		vps_staged_free(plans[i]);
	free(plans);
	return status;
}
