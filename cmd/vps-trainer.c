/* vps-trainer: the reference trainer, for tests and demos. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Killed while it holds shared memory: remove it. */
static bool remove_when_killed(const char *registry)
{
	pthread_t thread;
	snprintf(registry_to_remove, sizeof(registry_to_remove), "%s", registry);
	sigemptyset(&termination);
	sigaddset(&termination, SIGTERM);
	sigaddset(&termination, SIGINT);
	sigaddset(&termination, SIGHUP);
	if (pthread_sigmask(SIG_BLOCK, &termination, NULL) != 0 || pthread_create(&thread, NULL, reaper, NULL) != 0)
		return false;
	pthread_detach(thread);
	return true;
}

/* Train through the staged plans' switches; the verdict on standard output. */
static int train(char **paths, size_t nplans, const char *pattern, const struct launch *l,
		 struct vps_trainer_opts *o)
{
	struct vps_staged **plans = calloc(nplans, sizeof(*plans));
	struct vps_trainer_result res;
	char registry[VPS_REGISTRY_NAME_MAX + 1];
	int status;
	vps_result_t rc = plans ? VPS_OK : VPS_ENOMEM;
	for (size_t i = 0; i < nplans && !rc; i++)
		rc = vps_staged_load(&plans[i], paths[i]);
	/* the job's tag is its first plan's, as vps-exec computes it */
	if (!rc) {
		const struct vps_world *w = plans[0]->plan->world;
		struct vps_registry_name_parts parts = {vps_staged_world_hash(plans[0]), l->rank,
							vps_world_a_rank(w, l->rank), vps_world_b_rank(w, l->rank),
							l->local_rank};
		rc = vps_registry_expand(pattern, &parts, registry, sizeof(registry));
	}
	o->registry = registry;
	if (!rc && !remove_when_killed(registry)) {
		status = tool_error(EXIT_CHECK, "cannot start the signal thread");
		goto done;
	}
	if (!rc)
		rc = vps_trainer_run(plans, nplans, o, &res);
	if (rc) {
		char rank[32];
		snprintf(rank, sizeof(rank), "rank %" PRId64, o->rank);
		status = tool_fail_at(rank, rc);
	} else {
		bool ok = !res.wrong_elements && !res.dirty_padding && res.training_state_ok;
		printf("vps-trainer: rank %" PRId64 ": %" PRId64 " switch%s, step %" PRId64 ", %" PRId64
		       " samples; %" PRId64 " wrong elements, %" PRId64 " dirty padding, training state %s: %s\n",
		       o->rank, res.switches, res.switches == 1 ? "" : "es", res.step, res.consumed_samples,
		       res.wrong_elements, res.dirty_padding, res.training_state_ok ? "carried" : "LOST", ok ? "ok" : "FAILED");
		status = tool_finish(ok ? EXIT_OK : EXIT_CHECK);
	}
done:
	for (size_t i = 0; plans && i < nplans; i++)
		vps_staged_free(plans[i]);
	free(plans);
	return status;
}

int main(int argc, char **argv)
{
	struct launch l = {-1, -1, -1, "", 0, NULL};
	struct vps_trainer_opts o = VPS_TRAINER_OPTS_INIT;
	const char *pattern = VPS_REGISTRY_DEFAULT;
	struct tool_option options[] = {
		TOOL_OPT_STRING(0, "registry", &pattern),
		TOOL_OPT_RANK("rank", &l.rank),
		TOOL_OPT_RANK("local-rank", &l.local_rank),
		TOOL_OPT_COUNT("steps", &o.steps_before),
		TOOL_OPT_COUNT("steps-after", &o.steps_after),
		TOOL_OPT_COUNT("global-batch", &o.global_batch),
		TOOL_OPT_COUNT("micro-batch", &o.micro_batch),
		TOOL_OPT_STRING(0, "samples", &o.samples_log),
		TOOL_OPT_SECONDS("timeout", &o.timeout),
		TOOL_OPT_BOOL(0, "cuda", &o.cuda),
		TOOL_OPT_FUNC(0, "device", &o.device, tool_device),
		TOOL_OPT_END,
	};
	static const struct tool_rule rules[] = {{"device", "cuda", NULL, NULL}, {0}};
	struct tool_cli cli = {.usage = usage, .options = options, .rules = rules};
	int status = tool_parse(&cli, argc, argv);
	if (status == TOOL_PARSED)
		status = tool_operands(&cli, 1, SIZE_MAX, "a staged plan");
	if (status != TOOL_PARSED)
		return status;
	if (!launch_resolve(&l, false))
		return EXIT_USAGE;
	o.rank = l.rank;
	o.local_rank = l.local_rank;
	o.notice = say;
	o.notice_ctx = &l.rank;
	o.plan_names = (const char *const *)cli.operands;
	return train(cli.operands, cli.noperands, pattern, &l, &o);
}
