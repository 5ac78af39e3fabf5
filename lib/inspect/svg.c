/* The traffic of a plan as plain SVG (include/vps/svg.h). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "util/internal.h"
#include "vps/io.h"
#include "vps/svg.h"
#include "vps/units.h"

/* colour levels of the log scale: cells of one level in a row are one rect */
#define LEVELS 64
/* up to this many blocks a side, a cell is its own rect with a tooltip */
#define TOOLTIP_CELLS 64

struct svg {
	struct vps_bytes b;
	vps_result_t rc;
};

static void put(struct svg *s, const char *fmt, ...) VPS_PRINTF(2, 3);
static void put(struct svg *s, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	if (s->rc)
		return;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	/* every format here is short; a longer one is a bug, not truncated */
	if (n < 0 || (size_t)n >= sizeof(buf)) {
		s->rc = vps_fail(VPS_EINPUT, "svg: a line longer than %zu bytes", sizeof(buf));
		return;
	}
	s->rc = vps_bytes_append(&s->b, buf, (size_t)n);
}

/* Text content, escaped for XML. */
static void put_text(struct svg *s, const char *t)
{
	for (; *t && !s->rc; t++) {
		switch (*t) {
		case '&': put(s, "&amp;"); break;
		case '<': put(s, "&lt;"); break;
		case '>': put(s, "&gt;"); break;
		case '"': put(s, "&quot;"); break;
		default:
			/* control characters are not XML 1.0 */
			if ((unsigned char)*t >= 0x20 || *t == '\t')
				s->rc = vps_bytes_append(&s->b, t, 1);
		}
	}
}

/* Viridis, perceptually even and readable in grey: level 0 dark, top yellow. */
static void colour(int level, char out[8])
{
	static const unsigned char stops[9][3] = {
		{0x44, 0x01, 0x54}, {0x47, 0x2d, 0x7b}, {0x3b, 0x52, 0x8b}, {0x2c, 0x72, 0x8e}, {0x21, 0x91, 0x8c},
		{0x28, 0xae, 0x80}, {0x5e, 0xc9, 0x62}, {0xad, 0xdc, 0x30}, {0xfd, 0xe7, 0x25},
	};
	double t = (double)level / (LEVELS - 1) * 8.0;
	int i = (int)t;
	if (i >= 8)
		i = 7;
	double f = t - i;
	int c[3];
	for (int k = 0; k < 3; k++)
		c[k] = (int)lround(stops[i][k] + f * (stops[i + 1][k] - stops[i][k]));
	snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

struct scale {
	double lo, hi; /* log of the smallest and largest non-zero cell */
};

static int level_of(const struct scale *sc, int64_t v)
{
	if (sc->hi <= sc->lo)
		return LEVELS - 1;
	double t = (log((double)v) - sc->lo) / (sc->hi - sc->lo);
	int l = (int)lround(t * (LEVELS - 1));
	return l < 0 ? 0 : l > LEVELS - 1 ? LEVELS - 1 : l;
}

/* "rank 3" or "ranks 8-15" of block i of k ranks each. */
static void block_name(int64_t i, int64_t k, int64_t W, char *buf, size_t n)
{
	int64_t a = i * k, b = vps_min64(a + k, W) - 1;
	if (a == b)
		snprintf(buf, n, "rank %" PRId64, a);
	else
		snprintf(buf, n, "ranks %" PRId64 "-%" PRId64, a, b);
}

/* A round step (1, 2, 5, 10, 20, ...) that puts at most 16 labels on W ranks. */
static int64_t tick_step(int64_t W)
{
	static const int64_t mant[3] = {1, 2, 5};
	for (int64_t e = 1;; e *= 10)
		for (int i = 0; i < 3; i++)
			if (W / (e * mant[i]) <= 16)
				return e * mant[i];
}

/* What the picture shows: the plan's bytes by block of source and
 * destination ranks and by rank, and where nodes change. */
struct traffic {
	int64_t W, k, nb;       /* world ranks, ranks a block, blocks a side */
	int64_t *m;             /* nb x nb: bytes from source block i to destination block j */
	int64_t *send, *recv;   /* bytes per rank */
	int64_t *bsend, *brecv; /* per block, its busiest rank's */
	int64_t moved, vmax, barmax;
	struct scale sc;
	int64_t nodes_lines;    /* node changes between consecutive world ranks */
	int64_t g;              /* the ranks of every node when all nodes hold that many in one run, else -1 */
};

static void traffic_release(struct traffic *t)
{
	free(t->m);
	free(t->send);
	free(t->recv);
	free(t->bsend);
	free(t->brecv);
}

static vps_result_t traffic_init(struct traffic *t, const struct vps_plan *p)
{
	const int64_t W = vps_world_size(p->world), k = vps_ceil_div(W, VPS_SVG_MAX_CELLS), nb = vps_ceil_div(W, k);
	memset(t, 0, sizeof(*t));
	t->W = W;
	t->k = k;
	t->nb = nb;
	t->m = vps_calloc((size_t)(nb * nb), sizeof(*t->m));
	t->send = vps_calloc((size_t)W, sizeof(*t->send));
	t->recv = vps_calloc((size_t)W, sizeof(*t->recv));
	t->bsend = vps_calloc((size_t)nb, sizeof(*t->bsend));
	t->brecv = vps_calloc((size_t)nb, sizeof(*t->brecv));
	if (!t->m || !t->send || !t->recv || !t->bsend || !t->brecv) {
		traffic_release(t);
		return VPS_ENOMEM;
	}
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, p);
	for (const struct vps_piece *x; (x = vps_piece_iter_next(&it));) {
		if (x->src == x->dst)
			continue;
		int64_t bytes = vps_piece_bytes(x);
		int64_t *cell = &t->m[(x->src / k) * nb + x->dst / k];
		*cell = vps_sat_add(*cell, bytes);
		t->send[x->src] = vps_sat_add(t->send[x->src], bytes);
		t->recv[x->dst] = vps_sat_add(t->recv[x->dst], bytes);
		t->moved = vps_sat_add(t->moved, bytes);
	}
	int64_t vmin = 0;
	for (int64_t i = 0; i < nb * nb; i++)
		if (t->m[i]) {
			vmin = vmin && vmin < t->m[i] ? vmin : t->m[i];
			t->vmax = vps_max64(t->vmax, t->m[i]);
		}
	for (int64_t r = 0; r < W; r++) {
		t->bsend[r / k] = vps_max64(t->bsend[r / k], t->send[r]);
		t->brecv[r / k] = vps_max64(t->brecv[r / k], t->recv[r]);
		t->barmax = vps_max64(t->barmax, vps_max64(t->send[r], t->recv[r]));
	}
	t->sc = (struct scale){vmin ? log((double)vmin) : 0, t->vmax ? log((double)t->vmax) : 0};
	/* at least a decade: cells a few percent apart look alike, not opposite */
	if (t->sc.hi - t->sc.lo < log(10.0))
		t->sc.lo = t->sc.hi - log(10.0);
	int64_t same = 1;
	for (int64_t r = 1; r <= W; r++) {
		if (r < W && vps_world_device(p->world, r).node == vps_world_device(p->world, r - 1).node) {
			same++;
			continue;
		}
		t->g = !t->g || t->g == same ? same : -1;
		same = 1;
		t->nodes_lines += r < W;
	}
	return VPS_OK;
}

/* Where things go, in pixels: the map is nb cells of c a side (M), its
 * top left corner at (L, T); the send bars right of it at bx, the receive
 * bars under it at by; the legend at lx. */
struct geom {
	int64_t c, M, L, T, BW, BH, bx, by, lx, LH, width, height;
};

static void geom_of(const struct traffic *t, struct geom *g)
{
	const int64_t GAP = 12;
	g->c = vps_max64(2, vps_min64(48, 640 / t->nb));
	g->M = t->nb * g->c;
	g->L = 72;
	g->T = 104;
	g->BW = 120;
	g->BH = 120;
	g->bx = g->L + g->M + GAP;
	g->by = g->T + g->M + GAP;
	g->lx = g->bx + g->BW + 56;
	g->LH = vps_max64(160, vps_min64(g->M, 320));
	/* wide enough for the title lines whatever the world */
	g->width = vps_max64(g->lx + 20 + 96, 720);
	g->height = vps_max64(g->by + g->BH + 44, g->T + g->LH + 60);
}

static void draw_header(struct svg *s, const struct vps_plan *p, const char *caption, const struct traffic *t,
			const struct geom *g)
{
	const int64_t L = g->L, T = g->T, M = g->M;
	char a[256], b[256], t1[VPS_UNITS_LEN];
	vps_parallel_format(vps_layout_parallel(p->a), a, sizeof(a));
	vps_parallel_format(vps_layout_parallel(p->b), b, sizeof(b));
	put(s, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	put(s,
	    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%" PRId64 "\" height=\"%" PRId64 "\" viewBox=\"0 0 %" PRId64
	    " %" PRId64 "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"11\">\n",
	    g->width, g->height, g->width, g->height);
	put(s, "<title>");
	put_text(s, vps_layout_model(p->a)->name);
	put(s, ": traffic of the plan from %s to %s</title>\n", a, b);
	put(s, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
	put(s, "<text x=\"%" PRId64 "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">", L);
	put_text(s, vps_layout_model(p->a)->name);
	put(s, ": the traffic of a switch</text>\n");
	put(s, "<text x=\"%" PRId64 "\" y=\"38\">from %s</text>\n", L, a);
	put(s, "<text x=\"%" PRId64 "\" y=\"52\">to %s</text>\n", L, b);
	put(s, "<text x=\"%" PRId64 "\" y=\"66\">", L);
	if (caption && *caption) {
		put_text(s, caption);
		put(s, "; ");
	}
	put(s, "%" PRId64 " world ranks; %s moved between ranks", t->W, vps_format_bytes(t->moved, t1, sizeof(t1)));
	if (t->k > 1)
		put(s, "; cells of %" PRId64 " x %" PRId64 " ranks", t->k, t->k);
	put(s, "</text>\n");
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"middle\">destination rank</text>\n", L + M / 2,
	    T - 20);
	put(s,
	    "<text x=\"16\" y=\"%" PRId64 "\" text-anchor=\"middle\" transform=\"rotate(-90 16 %" PRId64
	    ")\">source rank</text>\n",
	    T + M / 2, T + M / 2);
}

/* The map: empty cells light grey, the rest by level. */
static void draw_map(struct svg *s, const struct traffic *t, const struct geom *g)
{
	const int64_t nb = t->nb, c = g->c, L = g->L, T = g->T;
	char t1[VPS_UNITS_LEN];
	put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
	       "\" fill=\"#f0f0f0\" stroke=\"#888888\"/>\n",
	    L, T, g->M, g->M);
	put(s, "<g shape-rendering=\"crispEdges\">\n");
	for (int64_t i = 0; i < nb && !s->rc; i++)
		for (int64_t j = 0; j < nb && !s->rc;) {
			int64_t v = t->m[i * nb + j];
			if (!v) {
				j++;
				continue;
			}
			int lv = level_of(&t->sc, v);
			int64_t run = 1;
			if (nb > TOOLTIP_CELLS)
				while (j + run < nb && t->m[i * nb + j + run] && level_of(&t->sc, t->m[i * nb + j + run]) == lv)
					run++;
			char col[8];
			colour(lv, col);
			put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
			       "\" fill=\"%s\"",
			    L + j * c, T + i * c, run * c, c, col);
			if (nb <= TOOLTIP_CELLS) {
				char from[64], to[64];
				block_name(i, t->k, t->W, from, sizeof(from));
				block_name(j, t->k, t->W, to, sizeof(to));
				put(s, "><title>%s &#8594; %s: %s</title></rect>\n", from, to,
				    vps_format_bytes(v, t1, sizeof(t1)));
			} else {
				put(s, "/>\n");
			}
			j += run;
		}
	put(s, "</g>\n");
}

/* Node boundaries, where consecutive world ranks change node, unless lines
 * closer than 6 pixels would hide the cells. @return whether drawn. */
static bool draw_nodes(struct svg *s, const struct vps_plan *p, const struct traffic *t, const struct geom *g)
{
	if (!t->nodes_lines || (t->nodes_lines + 1) * 6 > g->M)
		return false;
	put(s, "<g stroke=\"#d62728\" stroke-width=\"0.8\" stroke-opacity=\"0.6\">\n");
	for (int64_t r = 1; r < t->W && !s->rc; r++)
		if (vps_world_device(p->world, r).node != vps_world_device(p->world, r - 1).node) {
			double at = (double)r * (double)g->c / (double)t->k;
			put(s, "<line x1=\"%.1f\" y1=\"%" PRId64 "\" x2=\"%.1f\" y2=\"%" PRId64 "\"/>\n", g->L + at, g->T,
			    g->L + at, g->T + g->M);
			put(s, "<line x1=\"%" PRId64 "\" y1=\"%.1f\" x2=\"%" PRId64 "\" y2=\"%.1f\"/>\n", g->L, g->T + at,
			    g->L + g->M, g->T + at);
		}
	put(s, "</g>\n");
	return true;
}

/* Rank labels: on node boundaries when nodes are regular and labels cannot
 * fall on every rank. */
static void draw_labels(struct svg *s, const struct traffic *t, const struct geom *g)
{
	int64_t step = tick_step(t->W);
	if (t->g > 1 && step >= t->g)
		step = t->g * tick_step(t->W / t->g);
	for (int64_t r = 0; r < t->W && !s->rc; r += step) {
		double at = ((double)r + 0.5) * (double)g->c / (double)t->k;
		put(s, "<text x=\"%.1f\" y=\"%" PRId64 "\" text-anchor=\"middle\">%" PRId64 "</text>\n", g->L + at,
		    g->T - 6, r);
		put(s, "<text x=\"%" PRId64 "\" y=\"%.1f\" text-anchor=\"end\" dominant-baseline=\"middle\">%" PRId64
		       "</text>\n",
		    g->L - 6, g->T + at, r);
	}
}

/* Bars: sent to the right of the rows, received under the columns, on one
 * linear scale so that the two compare. */
static void draw_bars(struct svg *s, const struct traffic *t, const struct geom *g)
{
	const int64_t L = g->L, T = g->T, M = g->M, c = g->c, bx = g->bx, by = g->by, BW = g->BW, BH = g->BH;
	const int64_t barmax = t->barmax;
	char t1[VPS_UNITS_LEN];
	put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
	       "\" fill=\"none\" stroke=\"#cccccc\"/>\n",
	    bx, T, BW, M);
	put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
	       "\" fill=\"none\" stroke=\"#cccccc\"/>\n",
	    L, by, M, BH);
	put(s, "<g shape-rendering=\"crispEdges\">\n");
	for (int64_t i = 0; i < t->nb && barmax && !s->rc; i++) {
		int64_t gap = c >= 6 ? 1 : 0;
		double ls = (double)BW * (double)t->bsend[i] / (double)barmax;
		double lr = (double)BH * (double)t->brecv[i] / (double)barmax;
		if (t->bsend[i])
			put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%.1f\" height=\"%" PRId64
			       "\" fill=\"#1f77b4\"/>\n",
			    bx, T + i * c + gap, ls, c - 2 * gap);
		if (t->brecv[i])
			put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%.1f\" fill=\"#ff7f0e\"/>\n",
			    L + i * c + gap, by, c - 2 * gap, lr);
	}
	put(s, "</g>\n");
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" fill=\"#1f77b4\">sent</text>\n", bx, T - 6);
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" fill=\"#1f77b4\">0</text>\n", bx, T + M + 14);
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"end\" fill=\"#1f77b4\">%s</text>\n", bx + BW,
	    T + M + 14, vps_format_bytes(barmax, t1, sizeof(t1)));
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"end\" fill=\"#ff7f0e\">received</text>\n",
	    L - 6, by + 12);
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"end\" fill=\"#ff7f0e\">%s</text>\n", L - 6,
	    by + BH, vps_format_bytes(barmax, t1, sizeof(t1)));
	if (!barmax)
		return;
	/* the mean a rank sends (and receives): the level a balanced plan has */
	double mean = (double)t->moved / (double)t->W;
	double xs = (double)bx + (double)BW * mean / (double)barmax;
	double yr = (double)by + (double)BH * mean / (double)barmax;
	put(s, "<g stroke=\"#333333\" stroke-dasharray=\"3,3\">\n");
	put(s, "<line x1=\"%.1f\" y1=\"%" PRId64 "\" x2=\"%.1f\" y2=\"%" PRId64 "\"/>\n", xs, T, xs, T + M);
	put(s, "<line x1=\"%" PRId64 "\" y1=\"%.1f\" x2=\"%" PRId64 "\" y2=\"%.1f\"/>\n", L, yr, L + M, yr);
	put(s, "</g>\n");
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">bars: bytes a rank sends and receives%s; dashed: the mean, %s</text>\n",
	    L, by + BH + 18, t->k > 1 ? ", the busiest rank of each block" : "",
	    vps_format_bytes((int64_t)mean, t1, sizeof(t1)));
}

/* The legend: the levels, top the largest cell; then empty cells and the
 * node boundaries (nodes_drawn: as lines on the map). */
static void draw_legend(struct svg *s, const struct traffic *t, const struct geom *g, bool nodes_drawn)
{
	const int64_t lx = g->lx, T = g->T, LH = g->LH;
	char t1[VPS_UNITS_LEN];
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">bytes (log scale)</text>\n", lx, T - 14);
	if (t->vmax) {
		put(s, "<g shape-rendering=\"crispEdges\">\n");
		for (int l = 0; l < LEVELS && !s->rc; l++) {
			char col[8];
			colour(l, col);
			double y0 = (double)T + (double)LH * (LEVELS - 1 - l) / LEVELS;
			put(s, "<rect x=\"%" PRId64 "\" y=\"%.1f\" width=\"16\" height=\"%.1f\" fill=\"%s\"/>\n", lx, y0,
			    (double)LH / LEVELS + 0.5, col);
		}
		put(s, "</g>\n");
		const int nl = 4;
		for (int i = 0; i <= nl; i++) {
			double f = (double)i / nl;
			double v = exp(t->sc.hi - f * (t->sc.hi - t->sc.lo));
			put(s, "<text x=\"%" PRId64 "\" y=\"%.1f\" dominant-baseline=\"middle\">%s</text>\n", lx + 22,
			    (double)T + f * (double)LH, vps_format_bytes((int64_t)llround(v), t1, sizeof(t1)));
		}
	} else {
		put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">nothing moves</text>\n", lx, T + 12);
	}
	put(s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"16\" height=\"12\" fill=\"#f0f0f0\" stroke=\"#888888\"/>\n",
	    lx, T + LH + 10);
	put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">none</text>\n", lx + 22, T + LH + 20);
	if (t->nodes_lines && !nodes_drawn)
		put(s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">%" PRId64 " node boundaries:</text><text x=\"%" PRId64
		       "\" y=\"%" PRId64 "\">too close to draw</text>\n",
		    lx, T + LH + 40, t->nodes_lines, lx, T + LH + 54);
	else if (t->nodes_lines)
		put(s,
		    "<line x1=\"%" PRId64 "\" y1=\"%" PRId64 "\" x2=\"%" PRId64 "\" y2=\"%" PRId64
		    "\" stroke=\"#d62728\"/><text x=\"%" PRId64 "\" y=\"%" PRId64 "\">node boundary</text>\n",
		    lx, T + LH + 36, lx + 16, T + LH + 36, lx + 22, T + LH + 40);
}

vps_result_t vps_plan_svg(const struct vps_plan *p, const char *caption, struct vps_bytes *out)
{
	if (p->scope >= 0)
		return vps_fail(VPS_EINPUT,
				"a picture needs a global plan (this one is rank %" PRId64 "'s): plan without --rank",
				p->scope);
	if (vps_world_size(p->world) < 1)
		return vps_fail(VPS_EINPUT, "a picture needs a world of at least one rank");
	struct svg s = {{0}, VPS_OK};
	struct traffic t;
	struct geom g;
	VPS_CHECK(traffic_init(&t, p));
	geom_of(&t, &g);
	draw_header(&s, p, caption, &t, &g);
	draw_map(&s, &t, &g);
	bool nodes_drawn = draw_nodes(&s, p, &t, &g);
	draw_labels(&s, &t, &g);
	draw_bars(&s, &t, &g);
	draw_legend(&s, &t, &g, nodes_drawn);
	put(&s, "</svg>\n");
	traffic_release(&t);
	if (s.rc) {
		vps_bytes_release(&s.b);
		return s.rc;
	}
	*out = s.b;
	return VPS_OK;
}
