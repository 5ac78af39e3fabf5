/* The checkpoint-and-restart baseline: the state a switch moves, saved to
 * per-rank files and loaded back resharded, timed and checked.
 *
 * usage: ckpt_bench save STAGED DIR
 *        ckpt_bench load STAGED DIR
 *
 * save: one process per rank of layout A (the staged plan's source) fills
 * its state with the trainer's deterministic pattern, then, all at once on
 * a signal, writes it to DIR/rank-R.ckpt and fsyncs it; the time is from
 * the signal until the last fsync (and DIR's). As Megatron's fully parallel
 * distributed checkpoint does, a buffer that data-parallel replicas hold
 * alike (bf16 parameters; every state without ZeRO-1) is written once: each
 * replica writes an equal slice of it. A ZeRO-1 shard is its rank's alone.
 *
 * load: one process per rank of layout B allocates and touches its state
 * (framework start-up, not timed), then on a signal reads, with pread,
 * exactly the byte ranges every piece of its state needs (the staged plan's
 * moves and retains: a restart has lost what stayed on the device) from
 * the files of the ranks that wrote them; the time is from the signal until
 * the last rank has its state. Each rank then checks every element against
 * the pattern and its padding for zeros; a wrong element, a missing,
 * truncated or foreign file fails the run (exit 1), so the figure is never
 * that of wrong work.
 *
 * Prints YAML: seconds, bytes, and (load) preads. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vps/vps.h"

#define MAGIC "VPSCKPT1"
#define ALIGN 4096
#define STEP 1

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *prog = "ckpt_bench";
static const char *who = "";

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "%s: %s", prog, who);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* Where rank ra's buffer b is saved: by each member of its replica group a
 * slice [lo, hi) of its bytes. A buffer no one else holds alike is a group
 * of one. */
struct group {
	int64_t n;       /* members */
	int64_t *ranks;  /* ascending */
};

struct slot {
	uint64_t lo, hi; /* bytes of the buffer this rank writes */
	uint64_t off;    /* in its file */
};

struct ckpt {
	const struct vps_layout *a;
	int64_t na;                  /* ranks of A */
	struct vps_rank_view *views; /* every rank of A */
	struct group **groups;       /* [ra][b] */
	struct slot **slots;         /* [ra][b] */
	uint64_t *file_bytes;        /* [ra] */
};

static size_t buf_bytes(const struct vps_buffer *b) { return (size_t)b->elements * vps_dtype_size(b->dtype); }

/* Replicas of a buffer: same buffer index and size on ranks that differ
 * only in the data-parallel coordinate of its kind (dense or expert). */
static bool same_replica(const struct vps_rank_view *x, const struct vps_rank_view *y, size_t b)
{
	if (b >= y->nbuffers || buf_bytes(&x->buffers[b]) != buf_bytes(&y->buffers[b]) ||
	    x->buffers[b].state != y->buffers[b].state || x->buffers[b].expert != y->buffers[b].expert ||
	    x->buffers[b].chunk != y->buffers[b].chunk || y->buffers[b].sharded)
		return false;
	const struct vps_coords *p = &x->coords, *q = &y->coords;
	if (x->buffers[b].expert)
		return p->etp == q->etp && p->ep == q->ep && p->pp == q->pp;
	return p->tp == q->tp && p->pp == q->pp;
}

static void ckpt_init(struct ckpt *c, const struct vps_layout *a)
{
	memset(c, 0, sizeof(*c));
	c->a = a;
	c->na = vps_layout_world(a);
	c->views = calloc((size_t)c->na, sizeof(*c->views));
	c->groups = calloc((size_t)c->na, sizeof(*c->groups));
	c->slots = calloc((size_t)c->na, sizeof(*c->slots));
	c->file_bytes = calloc((size_t)c->na, sizeof(*c->file_bytes));
	if (!c->views || !c->groups || !c->slots || !c->file_bytes)
		die("out of memory");
	for (int64_t r = 0; r < c->na; r++)
		if (vps_layout_rank(a, r, &c->views[r]))
			die("layout A, rank %" PRId64 ": %s", r, vps_last_error());
	for (int64_t r = 0; r < c->na; r++) {
		const struct vps_rank_view *v = &c->views[r];
		c->groups[r] = calloc(v->nbuffers + 1, sizeof(struct group));
		c->slots[r] = calloc(v->nbuffers + 1, sizeof(struct slot));
		if (!c->groups[r] || !c->slots[r])
			die("out of memory");
		for (size_t b = 0; b < v->nbuffers; b++) {
			struct group *g = &c->groups[r][b];
			if (!(g->ranks = calloc((size_t)c->na, sizeof(int64_t))))
				die("out of memory");
			for (int64_t q = 0; q < c->na; q++)
				if (q == r || (!v->buffers[b].sharded && same_replica(v, &c->views[q], b)))
					g->ranks[g->n++] = q;
		}
	}
	/* slices and file offsets: member i of n writes elements [E i / n, E (i+1) / n) */
	for (int64_t r = 0; r < c->na; r++) {
		const struct vps_rank_view *v = &c->views[r];
		uint64_t at = ALIGN; /* the header's page */
		for (size_t b = 0; b < v->nbuffers; b++) {
			const struct group *g = &c->groups[r][b];
			int64_t i = 0;
			while (g->ranks[i] != r)
				i++;
			uint64_t E = (uint64_t)v->buffers[b].elements, es = vps_dtype_size(v->buffers[b].dtype);
			struct slot *s = &c->slots[r][b];
			s->lo = E * (uint64_t)i / (uint64_t)g->n * es;
			s->hi = E * (uint64_t)(i + 1) / (uint64_t)g->n * es;
			s->off = at;
			at += (s->hi - s->lo + ALIGN - 1) / ALIGN * ALIGN;
		}
		c->file_bytes[r] = at;
	}
}

static void ckpt_free(struct ckpt *c)
{
	for (int64_t r = 0; r < c->na; r++) {
		for (size_t b = 0; c->groups[r] && b < c->views[r].nbuffers; b++)
			free(c->groups[r][b].ranks);
		free(c->groups[r]);
		free(c->slots[r]);
		vps_rank_view_release(&c->views[r]);
	}
	free(c->views);
	free(c->groups);
	free(c->slots);
	free(c->file_bytes);
}

/* The header: magic, layout hash, rank, buffer count, then (lo, hi, off) per
 * buffer; a loader accepts only the file its layout predicts. */
static size_t header(const struct ckpt *c, int64_t r, unsigned char *h, size_t cap)
{
	size_t n = 0;
	uint64_t w[3] = {vps_layout_hash(c->a), (uint64_t)r, c->views[r].nbuffers};
	memcpy(h, MAGIC, 8);
	n = 8;
	memcpy(h + n, w, sizeof(w));
	n += sizeof(w);
	for (size_t b = 0; b < c->views[r].nbuffers && n + sizeof(struct slot) <= cap; b++) {
		memcpy(h + n, &c->slots[r][b], sizeof(struct slot));
		n += sizeof(struct slot);
	}
	return n;
}

static void path_of(char *p, size_t cap, const char *dir, int64_t r)
{
	snprintf(p, cap, "%s/rank-%" PRId64 ".ckpt", dir, r);
}

static unsigned char **alloc_state(const struct vps_rank_view *v)
{
	unsigned char **p = calloc(v->nbuffers + 1, sizeof(*p));
	if (!p)
		die("out of memory");
	for (size_t b = 0; b < v->nbuffers; b++) {
		size_t n = buf_bytes(&v->buffers[b]);
		if (!(p[b] = malloc(n ? n : 1)))
			die("out of memory for %zu bytes", n);
		/* a trainer's memory is backed before it saves or loads: touch it */
		memset(p[b], 0, n);
	}
	return p;
}

static void free_state(const struct vps_rank_view *v, unsigned char **p)
{
	for (size_t b = 0; p && b < v->nbuffers; b++)
		free(p[b]);
	free(p);
}

static void write_all(int fd, const void *p, uint64_t n, uint64_t off, const char *path)
{
	const unsigned char *q = p;
	while (n) {
		ssize_t k = pwrite(fd, q, n, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			die("%s: write: %s", path, k < 0 ? strerror(errno) : "no progress");
		q += k;
		n -= (uint64_t)k;
		off += (uint64_t)k;
	}
}

static void read_all(int fd, void *p, uint64_t n, uint64_t off, const char *path, int64_t *preads)
{
	unsigned char *q = p;
	while (n) {
		ssize_t k = pread(fd, q, n, (off_t)off);
		(*preads)++;
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			die("%s: read: %s", path, strerror(errno));
		if (k == 0)
			die("%s: truncated (no bytes at offset %" PRIu64 ")", path, off);
		q += k;
		n -= (uint64_t)k;
		off += (uint64_t)k;
	}
}

/* Run fn(rank) in one child per rank; each signals ready, waits for the go,
 * does its timed part, signals done, then its untimed checks. The time is
 * from the go to the last done. */
struct phase {
	int ready[2], go[2], done[2];
};

static void child_ready(struct phase *ph)
{
	close(ph->ready[0]);
	close(ph->go[1]);
	close(ph->done[0]);
	char x = 1;
	if (write(ph->ready[1], &x, 1) != 1)
		die("ready pipe: %s", strerror(errno));
	close(ph->ready[1]);
	/* the go is the parent closing its end: every child wakes at once */
	while (read(ph->go[0], &x, 1) < 0 && errno == EINTR)
		;
	close(ph->go[0]);
}

static void child_done(struct phase *ph)
{
	char x = 1;
	if (write(ph->done[1], &x, 1) != 1)
		die("done pipe: %s", strerror(errno));
	close(ph->done[1]);
}

typedef void (*rank_fn)(void *ctx, int64_t rank, struct phase *ph);

static double run_phase(int64_t n, rank_fn fn, void *ctx)
{
	struct phase ph;
	if (pipe(ph.ready) || pipe(ph.go) || pipe(ph.done))
		die("pipe: %s", strerror(errno));
	pid_t *pids = calloc((size_t)n + 1, sizeof(pid_t));
	if (!pids)
		die("out of memory");
	fflush(NULL);
	for (int64_t r = 0; r < n; r++) {
		pid_t p = fork();
		if (p < 0)
			die("fork: %s", strerror(errno));
		if (p == 0) {
			fn(ctx, r, &ph);
			fflush(NULL);
			_exit(0);
		}
		pids[r] = p;
	}
	close(ph.ready[1]);
	close(ph.go[0]);
	close(ph.done[1]);
	int64_t got = 0;
	char x;
	while (got < n) {
		ssize_t k = read(ph.ready[0], &x, 1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break; /* a child died before it was ready */
		got++;
	}
	double t0 = now(), t1 = t0;
	close(ph.go[1]);
	int64_t done = 0;
	if (got == n)
		while (done < n) {
			ssize_t k = read(ph.done[0], &x, 1);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				break;
			done++;
		}
	t1 = now();
	int failed = 0;
	for (int64_t r = 0; r < n; r++) {
		int st;
		while (waitpid(pids[r], &st, 0) < 0)
			if (errno != EINTR)
				die("waitpid: %s", strerror(errno));
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			failed = 1;
	}
	close(ph.ready[0]);
	close(ph.done[0]);
	free(pids);
	if (failed || got < n || done < n)
		exit(1); /* the child said why */
	return t1 - t0;
}

/* ---- save ---- */

struct save_ctx {
	const struct ckpt *c;
	const char *dir;
};

static void save_rank(void *ctx, int64_t r, struct phase *ph)
{
	const struct save_ctx *s = ctx;
	const struct ckpt *c = s->c;
	const struct vps_rank_view *v = &c->views[r];
	static char whobuf[64];
	snprintf(whobuf, sizeof(whobuf), "save rank %" PRId64 ": ", r);
	who = whobuf;
	unsigned char **st = alloc_state(v);
	for (size_t i = 0; i < v->nregions; i++) {
		const struct vps_region *g = &v->regions[i];
		struct vps_tensor t;
		if (vps_model_tensor(vps_layout_model(c->a), g->tensor, &t))
			die("%s", vps_last_error());
		vps_fill_region(st[g->buffer], g, &t, STEP);
	}
	char path[4096];
	path_of(path, sizeof(path), s->dir, r);
	unsigned char *h = calloc(ALIGN, 1);
	if (!h)
		die("out of memory");
	size_t hn = header(c, r, h, ALIGN);
	if (hn + sizeof(struct slot) > ALIGN && v->nbuffers)
		die("%zu buffers do not fit the header", v->nbuffers);
	child_ready(ph);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		die("%s: %s", path, strerror(errno));
	write_all(fd, h, ALIGN, 0, path);
	for (size_t b = 0; b < v->nbuffers; b++) {
		const struct slot *sl = &c->slots[r][b];
		write_all(fd, st[b] + sl->lo, sl->hi - sl->lo, sl->off, path);
	}
	if (ftruncate(fd, (off_t)c->file_bytes[r]) || fsync(fd) || close(fd))
		die("%s: %s", path, strerror(errno));
	child_done(ph);
	free(h);
	free_state(v, st);
}

/* ---- load ---- */

struct load_ctx {
	const struct ckpt *c;
	const struct vps_staged *s;
	const char *dir;
};

/* Read bytes [off, off + n) of A rank ra's buffer b into dst from the files
 * of the replicas that saved them. */
static void read_range(const struct ckpt *c, const int *fds, char (*paths)[4096], int64_t ra, uint32_t b,
		       uint64_t off, uint64_t n, unsigned char *dst, int64_t *preads)
{
	const struct group *g = &c->groups[ra][b];
	for (int64_t i = 0; i < g->n && n; i++) {
		int64_t m = g->ranks[i];
		const struct slot *sl = &c->slots[m][b];
		if (off >= sl->hi || off + n <= sl->lo)
			continue;
		uint64_t lo = off > sl->lo ? off : sl->lo, hi = off + n < sl->hi ? off + n : sl->hi;
		read_all(fds[m], dst + (lo - off), hi - lo, sl->off + (lo - sl->lo), paths[m], preads);
	}
}

static void check_header(const struct ckpt *c, int fd, const char *path, int64_t r, int64_t *preads)
{
	unsigned char want[ALIGN], got[ALIGN];
	size_t n = header(c, r, want, sizeof(want));
	read_all(fd, got, n, 0, path, preads);
	if (memcmp(want, got, n))
		die("%s: not rank %" PRId64 "'s checkpoint of layout A (its header differs)", path, r);
	struct stat sb;
	if (fstat(fd, &sb))
		die("%s: %s", path, strerror(errno));
	if ((uint64_t)sb.st_size < c->file_bytes[r])
		die("%s: truncated (%jd bytes, %" PRIu64 " expected)", path, (intmax_t)sb.st_size, c->file_bytes[r]);
}

static void load_rank(void *ctx, int64_t rb, struct phase *ph)
{
	const struct load_ctx *L = ctx;
	const struct ckpt *c = L->c;
	const struct vps_plan *p = L->s->plan;
	static char whobuf[64];
	snprintf(whobuf, sizeof(whobuf), "load rank %" PRId64 ": ", rb);
	who = whobuf;
	struct vps_rank_view v;
	if (vps_layout_rank(p->b, rb, &v))
		die("%s", vps_last_error());
	unsigned char **st = alloc_state(&v);
	int *fds = calloc((size_t)c->na + 1, sizeof(int));
	char (*paths)[4096] = calloc((size_t)c->na + 1, sizeof(*paths));
	if (!fds || !paths)
		die("out of memory");
	for (int64_t r = 0; r < c->na; r++)
		fds[r] = -1;
	child_ready(ph);
	int64_t preads = 0, bytes = 0;
	/* the files this rank reads, opened and their headers checked first */
	for (size_t i = 0; i < L->s->nxfers; i++) {
		const struct vps_xfer *x = &L->s->xfers[i];
		if (vps_world_b_rank(p->world, x->dst) != rb)
			continue;
		int64_t ra = vps_world_a_rank(p->world, x->src);
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &L->s->ops[x->first_op + k];
			const struct group *g = &c->groups[ra][o->src_buffer];
			for (int64_t j = 0; j < g->n; j++) {
				int64_t m = g->ranks[j];
				if (fds[m] >= 0)
					continue;
				path_of(paths[m], sizeof(paths[m]), L->dir, m);
				if ((fds[m] = open(paths[m], O_RDONLY | O_CLOEXEC)) < 0)
					die("%s: %s", paths[m], strerror(errno));
				check_header(c, fds[m], paths[m], m, &preads);
			}
		}
	}
	for (size_t i = 0; i < L->s->nxfers; i++) {
		const struct vps_xfer *x = &L->s->xfers[i];
		if (vps_world_b_rank(p->world, x->dst) != rb)
			continue;
		int64_t ra = vps_world_a_rank(p->world, x->src);
		for (size_t k = 0; k < x->nops; k++) {
			const struct vps_op *o = &L->s->ops[x->first_op + k];
			/* the innermost axes contiguous on both sides make one run */
			int64_t run = 1;
			int d = o->ndim;
			while (d > 0 && o->src_strides[d - 1] == run && o->dst_strides[d - 1] == run)
				run *= o->ext[--d];
			int64_t idx[VPS_MAX_DIMS] = {0};
			int64_t outer = 1;
			for (int e = 0; e < d; e++)
				outer *= o->ext[e];
			for (int64_t n = 0; n < outer; n++) {
				int64_t so = o->src_offset, dof = o->dst_offset;
				for (int e = 0; e < d; e++) {
					so += idx[e] * o->src_strides[e];
					dof += idx[e] * o->dst_strides[e];
				}
				read_range(c, fds, paths, ra, o->src_buffer, (uint64_t)so * o->esize,
					   (uint64_t)run * o->esize, st[o->dst_buffer] + (size_t)dof * o->esize, &preads);
				bytes += run * o->esize;
				for (int e = d - 1; e >= 0 && ++idx[e] == o->ext[e]; e--)
					idx[e] = 0;
			}
		}
	}
	child_done(ph);
	/* untimed: every element as the pattern says, padding zero */
	int64_t wrong = 0, dirty = 0;
	for (size_t i = 0; i < v.nregions; i++) {
		const struct vps_region *g = &v.regions[i];
		struct vps_tensor t;
		if (vps_model_tensor(vps_layout_model(p->b), g->tensor, &t))
			die("%s", vps_last_error());
		wrong += vps_check_region(st[g->buffer], g, &t, STEP);
	}
	for (size_t b = 0; b < v.nbuffers; b++) {
		size_t es = vps_dtype_size(v.buffers[b].dtype);
		int64_t el = v.buffers[b].elements;
		unsigned char *covered = calloc((size_t)el + 1, 1);
		if (!covered)
			die("out of memory");
		for (size_t i = 0; i < v.nregions; i++)
			if (v.regions[i].buffer == b) {
				int64_t first, end;
				vps_region_extent(&v.regions[i], &first, &end);
				memset(covered + first, 1, (size_t)(end - first));
			}
		for (int64_t e = 0; e < el; e++)
			if (!covered[e])
				for (size_t k = 0; k < es; k++)
					if (st[b][(size_t)e * es + k]) {
						dirty++;
						break;
					}
		free(covered);
	}
	if (wrong || dirty)
		die("%" PRId64 " wrong elements, %" PRId64 " nonzero padding elements after loading the checkpoint",
		    wrong, dirty);
	/* one line per rank, parent sums: written whole, so lines do not mix */
	char line[128];
	int ln = snprintf(line, sizeof(line), "rank %" PRId64 " %" PRId64 " %" PRId64 "\n", rb, bytes, preads);
	if (write(STDOUT_FILENO, line, (size_t)ln) != ln)
		die("stdout: %s", strerror(errno));
	for (int64_t r = 0; r < c->na; r++)
		if (fds[r] >= 0)
			close(fds[r]);
	free(fds);
	free(paths);
	free_state(&v, st);
	vps_rank_view_release(&v);
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[1], "save") && strcmp(argv[1], "load"))) {
		fprintf(stderr, "usage: %s save|load STAGED DIR\n", prog);
		return 2;
	}
	bool save = !strcmp(argv[1], "save");
	struct vps_staged *s = NULL;
	if (vps_staged_load(&s, argv[2])) {
		fprintf(stderr, "%s: %s: %s\n", prog, argv[2], vps_last_error());
		return 2;
	}
	if (s->scope >= 0) {
		fprintf(stderr, "%s: %s: a one-rank staged plan; the baseline needs the global one\n", prog, argv[2]);
		vps_staged_free(s);
		return 2;
	}
	struct ckpt c;
	ckpt_init(&c, s->plan->a);
	int64_t bytes = 0;
	for (int64_t r = 0; r < c.na; r++)
		for (size_t b = 0; b < c.views[r].nbuffers; b++)
			bytes += (int64_t)(c.slots[r][b].hi - c.slots[r][b].lo);
	if (save) {
		struct save_ctx ctx = {&c, argv[3]};
		double sec = run_phase(c.na, save_rank, &ctx);
		/* the files' names are durable only once their directory is */
		double t0 = now();
		int dfd = open(argv[3], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0 || fsync(dfd))
			die("%s: %s", argv[3], strerror(errno));
		close(dfd);
		sec += now() - t0;
		printf("ranks: %" PRId64 "\nbytes_written: %" PRId64 "\nseconds: %.4f\n", c.na, bytes, sec);
	} else {
		struct load_ctx ctx = {&c, s, argv[3]};
		int nb = (int)vps_layout_world(s->plan->b);
		fflush(stdout);
		double sec = run_phase(nb, load_rank, &ctx);
		printf("ranks: %d\nseconds: %.4f\n", nb, sec);
	}
	ckpt_free(&c);
	vps_staged_free(s);
	return 0;
}
