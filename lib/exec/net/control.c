/* The control tree: each rank's connections to its parent and children in
 * a CTL_FANOUT-ary tree rooted at rank 0, served by a loop thread, so that
 * they are looked after whatever the rank's own thread is doing (a stage, a
 * GPU copy, waiting for its trainer).
 *
 * Over a link go frames (a 12-byte header, then at most CTL_PART_MAX
 * bytes): a heartbeat when nothing else went for a quarter of the timeout;
 * a collective's part, up from a child once its subtree's parts are in,
 * and its result, down from the parent; "someone arrived" while the ranks
 * wait for a switch; and news of a failure. A rank silent for the timeout,
 * one that closes its link or sends what the protocol does not allow is
 * gone: the neighbour that sees it tells every rank, naming it, and every
 * collective ends at once (and every exchange, unless the rank closed its
 * connections: its peers see that themselves). A rank that fails on its own says
 * why the same way. The news goes to every link but the one it came by, so
 * every rank hears it once, in milliseconds, from whichever side of a gone
 * rank it lies on. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "util/internal.h"
#include "exec/net/net_int.h"

enum { F_BEAT = 1, F_UP, F_DOWN, F_FIRST, F_NEWS };

struct frame {
	uint8_t type, kind;
	uint16_t zero;
	uint32_t seq; /* the collective's number: every rank counts them alike */
	uint32_t len; /* bytes after the header */
};
#define FRAME_HDR sizeof(struct frame)

/* A failure, as it travels. NEWS_CONSEQUENCE: a rank gave up waiting for a
 * peer, or a peer's data connection ended under it (a symptom: the peer
 * may be waiting on a rank that stopped, or have given up for a reason the
 * tree brings later);
 * NEWS_FAILED: a rank failed on its own (alive, it says why); the others:
 * a neighbour found a rank gone. */
enum news_kind { NEWS_NONE, NEWS_CONSEQUENCE, NEWS_FAILED, NEWS_SILENT, NEWS_CLOSED, NEWS_LIED };
#define NEWS_TEXT_MAX 400

struct news_wire {
	int64_t failed, reporter;
	uint32_t kind, len; /* then len bytes of text, no NUL */
};

struct news {
	enum news_kind kind;
	int64_t failed, reporter;
	size_t len;
	char text[NEWS_TEXT_MAX]; /* as its reporter wrote it: made safe when printed */
};

/* What an epoll event of the loop points at. */
struct watch {
	struct ctl *c;
	int what; /* a link's index, or one of: */
};
enum { W_TIMER = -1, W_WAKE = -2 };

struct link {
	struct watch w;
	int fd;
	int64_t rank;
	bool dead;                 /* closed, failed, silent or lying: no more reads or writes */
	bool want_out;             /* in the epoll set for writing too */
	double last_heard, last_sent;
	unsigned char in[FRAME_HDR + CTL_PART_MAX];
	size_t in_len;
	unsigned char *out;        /* bytes queued for the socket */
	size_t out_len, out_cap;
	uint32_t first_seq;        /* "someone arrived" went this way, either way, for this arrival */
	bool part_in;              /* its part of the collective in progress came */
	/* a child's part of a collective this rank has not begun yet */
	bool early;
	struct frame early_hdr;
	unsigned char *early_part;
};

struct op {
	bool posted, done, mine, up_sent;
	enum ctl_kind kind;
	uint32_t seq;
	size_t len, ups;
	unsigned char acc[CTL_PART_MAX];
};

struct ctl {
	struct vps_net *n;
	struct vps_net_loop *loop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct link *links;        /* the parent first, when there is one */
	size_t nlinks;
	bool has_parent;
	int timerfd, wakefd, gonefd;
	struct watch timer_w, wake_w;
	double armed;              /* the timer's deadline; 0 none */
	double period;             /* of heartbeats */
	struct op op;
	uint32_t next_seq;
	uint32_t first_seq;        /* the arrival whose first request is known, and when */
	double first_time;
	double first_delay;        /* "someone arrived" is said after this, unless all did */
	double first_due;          /* when this rank says it; 0: said, or heard and sent on */
	struct news news;          /* the job's failure: what says most of what this rank learnt */
	double news_time;          /* when it was learnt */
	bool told;                 /* the rank's own thread has had its words */
	bool queued;               /* frames wait for the loop to send them */
	bool closing, unwatched, detached;
	struct ctl *next_closing;
	uint64_t msgs_sent, msgs_received, bytes_sent, bytes_received, beats_sent, beats_received;
	uint64_t notices_sent, notices_received; /* "someone arrived": as many as timing makes */
	/* the messages of each of the last collectives, by number */
	uint32_t recent_seq[8], recent_msgs[8], most_msgs;
	uint64_t wakes;            /* events the loop handled for this tree */
	double cpu;
};

struct vps_net_loop {
	pthread_t thread;
	int ep, stopfd;
	bool started;
};

size_t vps_net_ctl_neighbours(int64_t rank, int64_t world, int64_t *out)
{
	size_t n = 0;
	if (rank > 0)
		out[n++] = (rank - 1) / CTL_FANOUT;
	for (int64_t c = CTL_FANOUT * rank + 1; c <= CTL_FANOUT * rank + CTL_FANOUT && c < world; c++)
		out[n++] = c;
	return n;
}

static double thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the loop's side: links, frames, news ---- */

static void unwatch(struct ctl *c, int fd) { epoll_ctl(c->loop->ep, EPOLL_CTL_DEL, fd, NULL); }

static void watch_out(struct ctl *c, struct link *l, bool on)
{
	if (l->want_out == on)
		return;
	struct epoll_event ev = {EPOLLIN | (on ? EPOLLOUT : 0), {.ptr = &l->w}};
	if (!epoll_ctl(c->loop->ep, EPOLL_CTL_MOD, l->fd, &ev))
		l->want_out = on;
}

/* Give the socket what it takes of l's queue. */
static void flush_link(struct ctl *c, struct link *l)
{
	while (l->out_len && !l->dead) {
		ssize_t w = send(l->fd, l->out, l->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			watch_out(c, l, true);
			return;
		}
		if (w < 0) /* the read side says why */
			return;
		memmove(l->out, l->out + w, l->out_len - (size_t)w);
		l->out_len -= (size_t)w;
	}
	watch_out(c, l, false);
}

static void flush_all(struct ctl *c)
{
	c->queued = false;
	for (size_t i = 0; i < c->nlinks; i++)
		if (c->links[i].out_len)
			flush_link(c, &c->links[i]);
}

/* One more message of collective seq, sent or received. */
static void count_msg(struct ctl *c, uint32_t seq)
{
	size_t i = seq % 8;
	if (c->recent_seq[i] != seq) {
		c->recent_seq[i] = seq;
		c->recent_msgs[i] = 0;
	}
	if (++c->recent_msgs[i] > c->most_msgs)
		c->most_msgs = c->recent_msgs[i];
}

/* Queue a frame on l; the loop sends it (flush_all). A link that cannot
 * take it is gone, which its reader finds. */
static void queue(struct ctl *c, struct link *l, int type, int kind, uint32_t seq, const void *a, size_t alen,
		  const void *b, size_t blen)
{
	struct frame f = {(uint8_t)type, (uint8_t)kind, 0, seq, (uint32_t)(alen + blen)};
	size_t need = l->out_len + FRAME_HDR + alen + blen;
	if (l->dead || vps_grow((void **)&l->out, &l->out_cap, need, 1)) {
		vps_clear_error();
		return;
	}
	memcpy(l->out + l->out_len, &f, FRAME_HDR);
	if (alen)
		memcpy(l->out + l->out_len + FRAME_HDR, a, alen);
	if (blen)
		memcpy(l->out + l->out_len + FRAME_HDR + alen, b, blen);
	l->out_len = need;
	l->last_sent = vps_net_now();
	c->queued = true;
	c->bytes_sent += FRAME_HDR + alen + blen;
	if (type == F_BEAT)
		c->beats_sent++;
	else if (type == F_FIRST)
		c->notices_sent++;
	else
		c->msgs_sent++;
	if (type == F_UP || type == F_DOWN)
		count_msg(c, seq);
}

static const char *phase(const struct ctl *c)
{
	return c->op.posted && !c->op.done && c->op.kind == CTL_ARRIVE ? " while the ranks waited for the switch" : "";
}

/* Whether news x says more than what this rank knows: a failure over a
 * consequence (what the timeout or the ended connection was about), a rank
 * found silent or lying over either (what everyone else's failures were
 * about). A closed connection counts over a consequence only when another
 * rank closed it (a rank that failed and said so closes its links as it
 * exits: that is no news). */
static bool says_more(const struct ctl *c, const struct news *x)
{
	enum news_kind k = c->news.kind;
	if (k == NEWS_NONE)
		return true;
	if (x->kind == NEWS_SILENT || x->kind == NEWS_LIED)
		return k == NEWS_CONSEQUENCE || k == NEWS_FAILED;
	if (x->kind == NEWS_CLOSED)
		return k == NEWS_CONSEQUENCE && x->failed != c->news.failed;
	return x->kind == NEWS_FAILED && k == NEWS_CONSEQUENCE;
}

/* The job's failure: kept, and sent on to every link but the one it came
 * by, when it says more than what this rank knows (so each rank sends on
 * at most three). An exchange stops at once when a rank is silent or lies. */
static void set_news(struct ctl *c, const struct news *x, const struct link *from)
{
	if (!says_more(c, x))
		return;
	c->news = *x;
	c->news_time = vps_net_now();
	c->told = false;
	struct news_wire w = {x->failed, x->reporter, (uint32_t)x->kind, (uint32_t)x->len};
	for (size_t i = 0; i < c->nlinks; i++)
		if (&c->links[i] != from)
			queue(c, &c->links[i], F_NEWS, 0, 0, &w, sizeof(w), x->text, x->len);
	/* a rank that closed its links also closed its data connections, which
	 * its peers see; a silent or lying one must be named to them */
	if (x->kind == NEWS_SILENT || x->kind == NEWS_LIED) {
		uint64_t one = 1;
		(void)!write(c->gonefd, &one, sizeof(one));
	}
	pthread_cond_broadcast(&c->cv);
}

static void lost(struct ctl *c, struct link *l, enum news_kind kind, const char *fmt, ...) VPS_PRINTF(4, 5);
/* Link l is gone: no more reads or writes on it, and every rank hears why. */
static void lost(struct ctl *c, struct link *l, enum news_kind kind, const char *fmt, ...)
{
	if (l->dead)
		return;
	l->dead = true;
	unwatch(c, l->fd);
	struct news x = {kind, l->rank, c->n->rank, 0, ""};
	va_list ap;
	va_start(ap, fmt);
	int len = vsnprintf(x.text, sizeof(x.text), fmt, ap);
	va_end(ap);
	x.len = len < 0 ? 0 : (size_t)len >= sizeof(x.text) ? sizeof(x.text) - 1 : (size_t)len;
	set_news(c, &x, l);
}

static bool is_parent(const struct ctl *c, const struct link *l) { return c->has_parent && l == &c->links[0]; }

/* "Someone arrived", at `when`, to every link that has not heard it
 * either way (c->first_seq set). */
static void say_first(struct ctl *c)
{
	uint64_t age_us = (uint64_t)((vps_net_now() - c->first_time) * 1e6);
	c->first_due = 0;
	for (size_t i = 0; i < c->nlinks; i++)
		if (c->links[i].first_seq != c->first_seq) {
			c->links[i].first_seq = c->first_seq;
			queue(c, &c->links[i], F_FIRST, 0, c->first_seq, &age_us, sizeof(age_us), NULL, 0);
		}
}

/* Someone arrived for arrival seq at `when`: the clock of the window
 * starts. What this rank saw itself (its own request, a child's part) it
 * says after first_delay, unless every rank arrived by then (the usual
 * case: no message); what it heard it sends on at once, with its age, so
 * that every rank's clock starts at the first request. */
static void note_first(struct ctl *c, uint32_t seq, struct link *from, double when)
{
	if (from)
		from->first_seq = seq;
	if (c->first_seq != seq || when < c->first_time) {
		bool news = c->first_seq != seq;
		c->first_seq = seq;
		c->first_time = when;
		if (news && !from)
			c->first_due = when + c->first_delay;
		pthread_cond_broadcast(&c->cv);
	}
	if (from)
		say_first(c);
}

/* The collective a frame of seq belongs to must be the one in progress,
 * or the next. */
static uint32_t current_seq(const struct ctl *c) { return c->op.posted && !c->op.done ? c->op.seq : c->next_seq; }

static size_t part_len(const struct op *op, bool down)
{
	return op->kind == CTL_SUM || (op->kind == CTL_BCAST && down) ? op->len : 0;
}

/* A child's part of the collective in progress. */
static void combine(struct ctl *c, struct link *l, const struct frame *f, const unsigned char *part)
{
	struct op *op = &c->op;
	if (f->kind != op->kind || f->len != part_len(op, false)) {
		lost(c, l, NEWS_LIED,
		     "rank %" PRId64 " sent a part of %u bytes of collective %u of kind %u, where this rank runs one of kind %u"
		     " with %zu (another plan, or another version of vps-exec?)",
		     l->rank, f->len, f->seq, f->kind, op->kind, part_len(op, false));
		return;
	}
	if (op->kind == CTL_SUM)
		for (size_t i = 0; i < op->len / 8; i++) {
			uint64_t a, b;
			memcpy(&a, op->acc + 8 * i, 8);
			memcpy(&b, part + 8 * i, 8);
			a += b;
			memcpy(op->acc + 8 * i, &a, 8);
		}
	if (op->kind == CTL_ARRIVE)
		l->first_seq = op->seq; /* it knows: no "someone arrived" back */
	l->part_in = true;
	op->ups++;
}

/* A child's part of an arrival means someone arrived: said on, once the
 * part itself went up if it could (a parent needs one or the other). */
static void arrived_below(struct ctl *c)
{
	if (c->op.kind == CTL_ARRIVE && c->op.ups)
		note_first(c, c->op.seq, NULL, vps_net_now());
}

/* Up when this rank's subtree is in; at the root, the result goes down. */
static void progress(struct ctl *c)
{
	struct op *op = &c->op;
	if (!op->posted || op->done || op->up_sent || !op->mine || c->news.kind != NEWS_NONE)
		return;
	if (op->ups < c->nlinks - c->has_parent)
		return;
	if (c->has_parent) {
		queue(c, &c->links[0], F_UP, op->kind, op->seq, op->acc, part_len(op, false), NULL, 0);
		op->up_sent = true;
		if (op->kind == CTL_ARRIVE)
			c->links[0].first_seq = op->seq;
		return;
	}
	op->done = true;
	for (size_t i = 0; i < c->nlinks; i++)
		queue(c, &c->links[i], F_DOWN, op->kind, op->seq, op->acc, part_len(op, true), NULL, 0);
	pthread_cond_broadcast(&c->cv);
}

/* The children's parts that came before this rank began the collective. */
static void absorb_early(struct ctl *c)
{
	for (size_t i = c->has_parent; i < c->nlinks; i++) {
		struct link *l = &c->links[i];
		if (!l->early || l->early_hdr.seq != c->op.seq)
			continue;
		l->early = false;
		combine(c, l, &l->early_hdr, l->early_part);
		free(l->early_part);
		l->early_part = NULL;
	}
	progress(c);
	arrived_below(c);
}

static void on_up(struct ctl *c, struct link *l, const struct frame *f, const unsigned char *part)
{
	if (c->op.posted && !c->op.done && f->seq == c->op.seq) {
		combine(c, l, f, part);
		progress(c);
		arrived_below(c);
		return;
	}
	if (f->seq != current_seq(c) || l->early) {
		lost(c, l, NEWS_LIED, "rank %" PRId64 " sent its part of collective %u while this rank is at %u", l->rank,
		     f->seq, current_seq(c));
		return;
	}
	l->early_part = vps_malloc(f->len + 1);
	if (!l->early_part) {
		vps_clear_error();
		lost(c, l, NEWS_LIED, "rank %" PRId64 ": out of memory for its part", l->rank);
		return;
	}
	memcpy(l->early_part, part, f->len);
	l->early_hdr = *f;
	l->early = true;
}

static void on_down(struct ctl *c, struct link *l, const struct frame *f, const unsigned char *part)
{
	struct op *op = &c->op;
	if (!op->posted || op->done || !op->up_sent || f->seq != op->seq || f->kind != op->kind ||
	    f->len != part_len(op, true)) {
		lost(c, l, NEWS_LIED,
		     "rank %" PRId64 " sent the result of collective %u (kind %u, %u bytes) while this rank is at %u"
		     " (another plan, or another version of vps-exec?)",
		     l->rank, f->seq, f->kind, f->len, current_seq(c));
		return;
	}
	memcpy(op->acc, part, f->len);
	op->done = true;
	for (size_t i = c->has_parent; i < c->nlinks; i++)
		queue(c, &c->links[i], F_DOWN, op->kind, op->seq, op->acc, f->len, NULL, 0);
	pthread_cond_broadcast(&c->cv);
}

/* News from a peer: bounded by its frame, checked before use, its text
 * kept as bytes and made safe only when printed. */
static void on_news(struct ctl *c, struct link *l, const struct frame *f, const unsigned char *part)
{
	struct news_wire w;
	if (f->len < sizeof(w)) {
		lost(c, l, NEWS_LIED, "rank %" PRId64 " sent news of %u bytes", l->rank, f->len);
		return;
	}
	memcpy(&w, part, sizeof(w));
	int64_t W = c->n->world;
	if (w.kind < NEWS_CONSEQUENCE || w.kind > NEWS_LIED || w.len > NEWS_TEXT_MAX - 1 || f->len != sizeof(w) + w.len ||
	    w.failed < 0 || w.failed >= W || w.reporter < 0 || w.reporter >= W) {
		lost(c, l, NEWS_LIED, "rank %" PRId64 " sent news that does not parse (kind %u, rank %" PRId64 ", %u bytes)",
		     l->rank, w.kind, w.failed, f->len);
		return;
	}
	struct news x = {(enum news_kind)w.kind, w.failed, w.reporter, w.len, ""};
	memcpy(x.text, part + sizeof(w), w.len);
	set_news(c, &x, l);
}

static void on_frame(struct ctl *c, struct link *l, const struct frame *f, const unsigned char *part)
{
	c->bytes_received += FRAME_HDR + f->len;
	if (f->type == F_BEAT)
		c->beats_received++;
	else if (f->type == F_FIRST)
		c->notices_received++;
	else
		c->msgs_received++;
	if (f->type == F_UP || f->type == F_DOWN)
		count_msg(c, f->seq);
	switch (f->type) {
	case F_BEAT:
		break;
	case F_UP:
		if (is_parent(c, l))
			lost(c, l, NEWS_LIED, "rank %" PRId64 ", this rank's parent, sent a part up", l->rank);
		else
			on_up(c, l, f, part);
		break;
	case F_DOWN:
		if (!is_parent(c, l))
			lost(c, l, NEWS_LIED, "rank %" PRId64 ", this rank's child, sent a result down", l->rank);
		else
			on_down(c, l, f, part);
		break;
	case F_FIRST: {
		uint64_t age_us;
		if (f->len != sizeof(age_us)) {
			lost(c, l, NEWS_LIED, "rank %" PRId64 " sent \"someone arrived\" of %u bytes", l->rank, f->len);
			break;
		}
		memcpy(&age_us, part, sizeof(age_us));
		l->first_seq = f->seq;
		if (f->seq == current_seq(c))
			note_first(c, f->seq, l, vps_net_now() - (double)age_us * 1e-6);
		break;
	}
	case F_NEWS:
		on_news(c, l, f, part);
		break;
	}
}

/* What the link holds now, frame by frame. */
static void read_link(struct ctl *c, struct link *l)
{
	while (!l->dead) {
		ssize_t g = recv(l->fd, l->in + l->in_len, sizeof(l->in) - l->in_len, MSG_DONTWAIT);
		if (g < 0 && errno == EINTR)
			continue;
		if (g < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (g <= 0) {
			if (g == 0)
				lost(c, l, NEWS_CLOSED, "rank %" PRId64 " closed the connection%s", l->rank, phase(c));
			else
				lost(c, l, NEWS_CLOSED, "rank %" PRId64 ": %s%s", l->rank, strerror(errno), phase(c));
			return;
		}
		bool drained = (size_t)g < sizeof(l->in) - l->in_len; /* the socket had no more, for now */
		l->in_len += (size_t)g;
		l->last_heard = vps_net_now();
		size_t at = 0;
		while (!l->dead && l->in_len - at >= FRAME_HDR) {
			struct frame f;
			memcpy(&f, l->in + at, FRAME_HDR);
			if (f.zero || f.type < F_BEAT || f.type > F_NEWS || f.len > CTL_PART_MAX) {
				lost(c, l, NEWS_LIED,
				     "rank %" PRId64 " sent a frame of type %u and %u bytes (another version of vps-exec?)", l->rank,
				     f.type, f.len);
				return;
			}
			if (l->in_len - at < FRAME_HDR + f.len)
				break;
			on_frame(c, l, &f, l->in + at + FRAME_HDR);
			at += FRAME_HDR + f.len;
		}
		memmove(l->in, l->in + at, l->in_len - at);
		l->in_len -= at;
		/* level-triggered: what comes later wakes the loop again */
		if (drained)
			return;
	}
}

/* Heartbeats due, and neighbours silent for the timeout. */
static void tick(struct ctl *c)
{
	double t = vps_net_now(), T = c->n->timeout;
	for (size_t i = 0; i < c->nlinks; i++) {
		struct link *l = &c->links[i];
		if (l->dead)
			continue;
		if (t - l->last_heard >= T)
			lost(c, l, NEWS_SILENT, "rank %" PRId64 " gave no sign of life for %g s%s (stopped, or cut off?)", l->rank,
			     T, phase(c));
		else if (t - l->last_sent >= c->period)
			queue(c, l, F_BEAT, 0, 0, NULL, 0, NULL, 0);
	}
	if (c->first_due > 0 && t >= c->first_due) {
		if (c->op.posted && !c->op.done && c->op.kind == CTL_ARRIVE && c->first_seq == c->op.seq)
			say_first(c);
		c->first_due = 0;
	}
}

/* The timer at the next heartbeat or silence deadline, when that is
 * earlier than the one set (a later one is met by waking and looking). */
static void arm(struct ctl *c)
{
	double next = 0;
	for (size_t i = 0; i < c->nlinks; i++) {
		const struct link *l = &c->links[i];
		if (l->dead)
			continue;
		double d = l->last_sent + c->period, s = l->last_heard + c->n->timeout;
		d = d < s ? d : s;
		next = next == 0 || d < next ? d : next;
	}
	if (c->first_due > 0 && (next == 0 || c->first_due < next))
		next = c->first_due;
	if (next == 0 || (c->armed != 0 && c->armed <= next))
		return;
	/* the timer's clock is CLOCK_MONOTONIC, as vps_net_now's */
	struct itimerspec it = {{0, 0}, {(time_t)next, (long)((next - (double)(time_t)next) * 1e9)}};
	if (it.it_value.tv_sec == 0 && it.it_value.tv_nsec == 0)
		it.it_value.tv_nsec = 1;
	if (!timerfd_settime(c->timerfd, TFD_TIMER_ABSTIME, &it, NULL))
		c->armed = next;
}

/* Leaving: what is queued (news of a failure, above all) goes out, within
 * a second, before the links close. */
static void say_last(struct ctl *c)
{
	double end = vps_net_now() + 1.0;
	for (;;) {
		flush_all(c);
		size_t left = 0;
		for (size_t i = 0; i < c->nlinks; i++)
			left += c->links[i].out_len && !c->links[i].dead;
		if (!left || vps_net_now() >= end)
			return;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
}

static void handle(struct ctl *c, struct watch *w, uint32_t events, struct ctl **closing)
{
	uint64_t v;
	if (w->what == W_WAKE) {
		(void)!read(c->wakefd, &v, sizeof(v));
		if (c->closing) {
			say_last(c);
			for (size_t i = 0; i < c->nlinks; i++)
				if (!c->links[i].dead)
					unwatch(c, c->links[i].fd);
			unwatch(c, c->timerfd);
			unwatch(c, c->wakefd);
			c->unwatched = true;
			c->next_closing = *closing;
			*closing = c;
			return;
		}
	} else if (w->what == W_TIMER) {
		(void)!read(c->timerfd, &v, sizeof(v));
		c->armed = 0;
		tick(c);
	} else {
		struct link *l = &c->links[w->what];
		if (events & EPOLLOUT)
			flush_link(c, l);
		if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
			read_link(c, l);
	}
	flush_all(c);
	arm(c);
}

static void *loop_main(void *arg)
{
	struct vps_net_loop *L = arg;
	struct epoll_event ev[256];
	for (;;) {
		int ne = epoll_wait(L->ep, ev, 256, -1);
		if (ne < 0 && errno == EINTR)
			continue;
		if (ne < 0)
			return NULL;
		struct ctl *closing = NULL, *prev = NULL;
		/* the loop's time goes to the tree whose events it handles: the
		 * clock is read where the tree changes, not at every event */
		double t0 = thread_cpu(), t;
		for (int k = 0; k < ne; k++) {
			struct watch *w = ev[k].data.ptr;
			if (!w)
				return NULL;
			struct ctl *c = w->c;
			if (prev && prev != c) {
				t = thread_cpu();
				pthread_mutex_lock(&prev->mu);
				prev->cpu += t - t0;
				pthread_mutex_unlock(&prev->mu);
				t0 = t;
			}
			pthread_mutex_lock(&c->mu);
			c->wakes++;
			if (!c->unwatched)
				handle(c, w, ev[k].events, &closing);
			pthread_mutex_unlock(&c->mu);
			prev = c;
		}
		if (prev) {
			t = thread_cpu();
			pthread_mutex_lock(&prev->mu);
			prev->cpu += t - t0;
			pthread_mutex_unlock(&prev->mu);
		}
		/* after the batch, whose later events may name them */
		while (closing) {
			struct ctl *c = closing;
			closing = c->next_closing;
			pthread_mutex_lock(&c->mu);
			c->detached = true;
			pthread_cond_broadcast(&c->cv);
			pthread_mutex_unlock(&c->mu);
		}
	}
}

vps_result_t vps_net_loop_new(struct vps_net_loop **out)
{
	struct vps_net_loop *L = vps_calloc(1, sizeof(*L));
	if (!L)
		return VPS_ENOMEM;
	L->ep = epoll_create1(EPOLL_CLOEXEC);
	L->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct epoll_event ev = {EPOLLIN, {.ptr = NULL}};
	vps_result_t rc = VPS_OK;
	if (L->ep < 0 || L->stopfd < 0 || epoll_ctl(L->ep, EPOLL_CTL_ADD, L->stopfd, &ev))
		rc = vps_fail_errno("the control loop");
	/* signals stay the rank's own thread's */
	sigset_t all, old;
	sigfillset(&all);
	if (!rc) {
		pthread_sigmask(SIG_SETMASK, &all, &old);
		int e = pthread_create(&L->thread, NULL, loop_main, L);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (e)
			rc = vps_fail(VPS_ESYS, "the control loop's thread: %s", strerror(e));
		L->started = !e;
	}
	if (rc) {
		vps_net_loop_free(L);
		return rc;
	}
	*out = L;
	return VPS_OK;
}

void vps_net_loop_free(struct vps_net_loop *L)
{
	if (!L)
		return;
	if (L->started) {
		uint64_t one = 1;
		(void)!write(L->stopfd, &one, sizeof(one));
		pthread_join(L->thread, NULL);
	}
	if (L->ep >= 0)
		close(L->ep);
	if (L->stopfd >= 0)
		close(L->stopfd);
	free(L);
}

/* ---- the rank's side ---- */

static void wake(struct ctl *c)
{
	uint64_t one = 1;
	(void)!write(c->wakefd, &one, sizeof(one));
}

static void ctl_close(struct ctl *c)
{
	for (size_t i = 0; c->links && i < c->nlinks; i++) {
		if (c->links[i].fd >= 0)
			close(c->links[i].fd);
		free(c->links[i].out);
		free(c->links[i].early_part);
	}
	free(c->links);
	if (c->timerfd >= 0)
		close(c->timerfd);
	if (c->wakefd >= 0)
		close(c->wakefd);
	if (c->gonefd >= 0)
		close(c->gonefd);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

vps_result_t vps_ctl_new(struct vps_net *n, struct vps_net_loop *loop, const int *fds, size_t nfds)
{
	struct ctl *c = vps_calloc(1, sizeof(*c));
	if (!c) {
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		return VPS_ENOMEM;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	c->n = n;
	c->loop = loop;
	c->period = n->timeout / 4;
	c->has_parent = n->rank > 0;
	c->next_seq = 1;
	c->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	c->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->gonefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->links = vps_calloc(nfds + 1, sizeof(*c->links));
	vps_result_t rc = c->links ? VPS_OK : VPS_ENOMEM;
	int64_t ranks[1 + CTL_FANOUT];
	vps_net_ctl_neighbours(n->rank, n->world, ranks);
	/* a neighbour is first heard once its own start is over, which takes at
	 * most the timeout */
	double t = vps_net_now();
	for (size_t i = 0; i < nfds; i++) {
		if (!c->links) {
			close(fds[i]);
			continue;
		}
		c->links[i] = (struct link){.w = {c, (int)i}, .fd = fds[i], .rank = ranks[i], .last_heard = t + n->timeout,
					    .last_sent = t};
		c->nlinks++;
	}
	if (!rc && (c->timerfd < 0 || c->wakefd < 0 || c->gonefd < 0))
		rc = vps_fail_errno("the control tree");
	c->timer_w = (struct watch){c, W_TIMER};
	c->wake_w = (struct watch){c, W_WAKE};
	vps_net_account(n, (int64_t)(sizeof(*c) + (nfds + 1) * sizeof(*c->links)));
	if (rc) {
		ctl_close(c);
		return rc;
	}
	/* the wake first: once it is in, the loop can be asked to let go */
	struct epoll_event ev = {EPOLLIN, {.ptr = &c->wake_w}};
	if (epoll_ctl(loop->ep, EPOLL_CTL_ADD, c->wakefd, &ev)) {
		rc = vps_fail_errno("the control tree");
		ctl_close(c);
		return rc;
	}
	n->ctl = c;
	ev.data.ptr = &c->timer_w;
	if (epoll_ctl(loop->ep, EPOLL_CTL_ADD, c->timerfd, &ev))
		return vps_fail_errno("the control tree");
	for (size_t i = 0; i < c->nlinks; i++) {
		ev.data.ptr = &c->links[i].w;
		if (epoll_ctl(loop->ep, EPOLL_CTL_ADD, c->links[i].fd, &ev))
			return vps_fail_errno("the control tree");
	}
	/* the loop arms the timer */
	wake(c);
	return VPS_OK;
}

void vps_ctl_free(struct vps_net *n)
{
	struct ctl *c = n->ctl;
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->closing = true;
	pthread_mutex_unlock(&c->mu);
	wake(c);
	pthread_mutex_lock(&c->mu);
	while (!c->detached)
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	vps_net_account(n, -(int64_t)(sizeof(*c) + (c->nlinks + 1) * sizeof(*c->links)));
	ctl_close(c);
	n->ctl = NULL;
}

int vps_ctl_gone_fd(const struct ctl *c) { return c->gonefd; }

/* The news as this rank says it (c->mu held). */
static vps_result_t failure_locked(struct ctl *c, const char *what)
{
	const struct news *x = &c->news;
	char text[4 * NEWS_TEXT_MAX + 64], said[4 * NEWS_TEXT_MAX + 128];
	vps_net_sanitize(text, sizeof(text), x->text, x->len);
	bool own_words = x->kind == NEWS_CONSEQUENCE || x->kind == NEWS_FAILED;
	if (own_words && x->failed != c->n->rank)
		snprintf(said, sizeof(said), "rank %" PRId64 " failed: %s", x->failed, text);
	else if (!own_words && x->reporter != c->n->rank)
		snprintf(said, sizeof(said), "rank %" PRId64 ": %s", x->reporter, text);
	else
		snprintf(said, sizeof(said), "%s", text);
	c->told = true;
	vps_result_t code = x->kind == NEWS_SILENT && x->reporter == c->n->rank ? VPS_ETIMEOUT : VPS_EPEER;
	return what ? vps_fail(code, "%s: %s", what, said) : vps_fail(code, "%s", said);
}

/* Whether the failure this rank knows is the one to report (c->mu held):
 * another rank's timeout is given the timeout to be explained (a rank
 * found silent meanwhile is what it was about). *until: when to look
 * again, 0 when only news can change it. */
static bool settled(const struct ctl *c, double *until)
{
	*until = 0;
	if (c->news.kind == NEWS_NONE)
		return false;
	if (c->news.kind != NEWS_CONSEQUENCE)
		return true;
	*until = c->news_time + c->n->timeout;
	return vps_net_now() >= *until;
}

/* Wait for news (c->mu held) until `until` (0: without a limit). */
static void wait_until(struct ctl *c, double until)
{
	if (until <= 0) {
		pthread_cond_wait(&c->cv, &c->mu);
		return;
	}
	struct timespec ts = {(time_t)until, (long)((until - (double)(time_t)until) * 1e9)};
	pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

vps_result_t vps_ctl_failure(struct ctl *c, const char *what)
{
	pthread_mutex_lock(&c->mu);
	vps_result_t rc = failure_locked(c, what);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void vps_ctl_fail(struct ctl *c, bool consequence, const char *why)
{
	pthread_mutex_lock(&c->mu);
	struct news x = {consequence ? NEWS_CONSEQUENCE : NEWS_FAILED, c->n->rank, c->n->rank, 0, ""};
	x.len = (size_t)vps_min64((int64_t)strlen(why), NEWS_TEXT_MAX - 1);
	memcpy(x.text, why, x.len);
	if (says_more(c, &x)) {
		set_news(c, &x, NULL);
		c->told = true;
	}
	pthread_mutex_unlock(&c->mu);
	wake(c);
}

vps_result_t vps_ctl_own_failure(struct ctl *c, vps_result_t mine, double patience, bool left, const char *words)
{
	pthread_mutex_lock(&c->mu);
	/* a timeout may be about a rank that stopped: its tree neighbours find
	 * that within the timeout; a connection that ended, about a rank that
	 * gave up for a reason of its own, which may come the long way round */
	for (double until = vps_net_now() + patience; vps_net_now() < until &&
						     (c->news.kind == NEWS_NONE || c->news.kind == NEWS_CONSEQUENCE);)
		wait_until(c, until);
	bool none = c->news.kind == NEWS_NONE || c->news.kind == NEWS_CONSEQUENCE;
	if (none || c->told || c->news.failed == c->n->rank) {
		pthread_mutex_unlock(&c->mu);
		if (none && left)
			return vps_fail(mine,
					"%s; no rank said why within %g s: the connection broke while both ranks ran, or "
					"the rank ended without a word",
					words, patience);
		return vps_fail(mine, "%s", words);
	}
	failure_locked(c, NULL);
	pthread_mutex_unlock(&c->mu);
	char other[4 * NEWS_TEXT_MAX + 128];
	snprintf(other, sizeof(other), "%s", vps_last_error());
	return vps_fail(mine, "%s; %s", words, other);
}

/* Begin the next collective (c->mu held). */
static void post(struct ctl *c, enum ctl_kind kind, const void *buf, size_t len)
{
	c->op = (struct op){.posted = true, .mine = kind != CTL_ARRIVE, .kind = kind, .seq = c->next_seq++, .len = len};
	for (size_t i = 0; i < c->nlinks; i++)
		c->links[i].part_in = false;
	if (buf && len)
		memcpy(c->op.acc, buf, len);
	absorb_early(c);
}

vps_result_t vps_ctl_collective(struct ctl *c, enum ctl_kind kind, void *buf, size_t len, const char *what)
{
	if (len > CTL_PART_MAX)
		return vps_fail(VPS_EINTERNAL, "%s: %zu bytes, more than a collective carries (%d)", what, len, CTL_PART_MAX);
	pthread_mutex_lock(&c->mu);
	post(c, kind, buf, len);
	/* the loop is woken only when there is something to send: rank 0's
	 * part waits for its children's */
	bool send = c->queued;
	pthread_mutex_unlock(&c->mu);
	if (send)
		wake(c);
	pthread_mutex_lock(&c->mu);
	double until;
	struct net_wait w;
	vps_net_wait_begin(c->n, &w);
	while (!c->op.done && !settled(c, &until)) {
		wait_until(c, w.next && (!until || w.next < until) ? w.next : until);
		double t = vps_net_now();
		if (!c->op.done && c->news.kind == NEWS_NONE && vps_net_wait_due(c->n, &w, t)) {
			char so_far[32];
			snprintf(so_far, sizeof(so_far), "(%.0f s so far)", t - w.start);
			pthread_mutex_unlock(&c->mu);
			vps_ctl_say_awaited(c, what, so_far);
			pthread_mutex_lock(&c->mu);
		}
	}
	vps_result_t rc = VPS_OK;
	if (c->op.done && buf && len)
		memcpy(buf, c->op.acc, len);
	else if (!c->op.done)
		rc = failure_locked(c, NULL);
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void vps_ctl_arrive_begin(struct ctl *c, double window)
{
	pthread_mutex_lock(&c->mu);
	c->first_delay = window / 16;
	post(c, CTL_ARRIVE, NULL, 0);
	pthread_mutex_unlock(&c->mu);
	/* the loop arms the timer of "someone arrived" */
	wake(c);
}

void vps_ctl_arrive_mine(struct ctl *c)
{
	pthread_mutex_lock(&c->mu);
	c->op.mine = true;
	progress(c);
	note_first(c, c->op.seq, NULL, vps_net_now());
	pthread_mutex_unlock(&c->mu);
	wake(c);
}

int vps_ctl_arrive_wait(struct ctl *c, double seconds, double *first)
{
	pthread_mutex_lock(&c->mu);
	double until;
	if (!c->op.done && !settled(c, &until)) {
		double at = seconds < 0 ? until : vps_net_now() + seconds;
		if (until > 0 && until < at)
			at = until;
		wait_until(c, at);
	}
	int r = c->op.done ? 1 : settled(c, &until) ? -1 : 0;
	*first = c->first_seq == c->op.seq ? c->first_time : -1;
	pthread_mutex_unlock(&c->mu);
	return r;
}

/* A neighbour as a wait names it: its rank and address. */
static void add_link(struct net_names *l, const struct link *k)
{
	struct sockaddr_in sa;
	socklen_t len = sizeof(sa);
	if (!getpeername(k->fd, (struct sockaddr *)&sa, &len) && sa.sin_family == AF_INET)
		vps_net_names_add(l, "rank %" PRId64 " at %s", k->rank, inet_ntoa(sa.sin_addr));
	else
		vps_net_names_add(l, "rank %" PRId64, k->rank);
}

void vps_ctl_say_awaited(struct ctl *c, const char *what, const char *so_far)
{
	char list[384];
	struct net_names l;
	vps_net_names_init(&l, list, sizeof(list));
	pthread_mutex_lock(&c->mu);
	const struct op *op = &c->op;
	bool parent = op->posted && !op->done && op->up_sent;
	if (parent)
		add_link(&l, &c->links[0]);
	for (size_t i = c->has_parent; i < c->nlinks && op->posted && !op->done && !parent; i++)
		if (!c->links[i].part_in)
			add_link(&l, &c->links[i]);
	pthread_mutex_unlock(&c->mu);
	vps_net_names_end(&l);
	if (!l.named)
		return;
	if (parent)
		vps_net_say(c->n, "%s: this rank and those below it in the control tree are ready; waiting for the others,"
				  " whose word comes from rank 0 through %s %s", what, list, so_far);
	else
		vps_net_say(c->n, "%s: this rank is ready; waiting for %s (or a rank below it in the control tree) %s", what,
			    list, so_far);
}

void vps_net_stats(const struct vps_net *n, struct vps_net_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < n->npeers; i++)
		out->data_connections += n->fds[i] >= 0;
	out->bootstrap_connections = n->bootstrap_sockets;
	out->data_bytes_sent = n->sent;
	out->data_bytes_received = n->received;
	out->memory = n->mem;
	out->memory_peak = n->mem_peak;
	struct ctl *c = n->ctl;
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->nlinks; i++)
		out->control_connections += !c->links[i].dead;
	out->control_messages_sent = c->msgs_sent;
	out->control_messages_received = c->msgs_received;
	out->control_bytes_sent = c->bytes_sent;
	out->control_bytes_received = c->bytes_received;
	out->heartbeats_sent = c->beats_sent;
	out->heartbeats_received = c->beats_received;
	out->arrival_notices_sent = c->notices_sent;
	out->arrival_notices_received = c->notices_received;
	out->control_cpu_seconds = c->cpu;
	out->control_wakes = c->wakes;
	out->control_messages_per_collective = c->most_msgs;
	uint32_t last = c->next_seq - 1;
	if (c->next_seq > 1 && c->recent_seq[last % 8] == last)
		out->control_messages_last_collective = c->recent_msgs[last % 8];
	for (size_t i = 0; i < c->nlinks; i++)
		out->memory += c->links[i].out_cap;
	pthread_mutex_unlock(&c->mu);
}
