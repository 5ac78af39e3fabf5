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

vps_result_t vps_plan_svg(const struct vps_plan *p, const char *caption, struct vps_bytes *out)
{
	if (p->scope >= 0)
		return vps_fail(VPS_EINPUT,
				"a picture needs a global plan (this one is rank %" PRId64 "'s): plan without --rank",
				p->scope);
	const int64_t W = vps_world_size(p->world);
	if (W < 1)
		return vps_fail(VPS_EINPUT, "a picture needs a world of at least one rank");
	const int64_t k = vps_ceil_div(W, VPS_SVG_MAX_CELLS), nb = vps_ceil_div(W, k);
	struct svg s = {{0}, VPS_OK};
	int64_t *m = vps_calloc((size_t)(nb * nb), sizeof(*m));
	int64_t *send = vps_calloc((size_t)W, sizeof(*send)), *recv = vps_calloc((size_t)W, sizeof(*recv));
	int64_t *bsend = vps_calloc((size_t)nb, sizeof(*bsend)), *brecv = vps_calloc((size_t)nb, sizeof(*brecv));
	if (!m || !send || !recv || !bsend || !brecv) {
		s.rc = VPS_ENOMEM;
		goto done;
	}
	int64_t moved = 0;
	struct vps_piece_iter it;
	vps_piece_iter_init(&it, p);
	for (const struct vps_piece *x; (x = vps_piece_iter_next(&it));) {
		if (x->src == x->dst)
			continue;
		int64_t bytes = vps_piece_bytes(x);
		int64_t *cell = &m[(x->src / k) * nb + x->dst / k];
		*cell = vps_sat_add(*cell, bytes);
		send[x->src] = vps_sat_add(send[x->src], bytes);
		recv[x->dst] = vps_sat_add(recv[x->dst], bytes);
		moved = vps_sat_add(moved, bytes);
	}
	int64_t vmin = 0, vmax = 0, barmax = 0;
	for (int64_t i = 0; i < nb * nb; i++)
		if (m[i]) {
			vmin = vmin && vmin < m[i] ? vmin : m[i];
			vmax = vps_max64(vmax, m[i]);
		}
	for (int64_t r = 0; r < W; r++) {
		bsend[r / k] = vps_max64(bsend[r / k], send[r]);
		brecv[r / k] = vps_max64(brecv[r / k], recv[r]);
		barmax = vps_max64(barmax, vps_max64(send[r], recv[r]));
	}
	struct scale sc = {vmin ? log((double)vmin) : 0, vmax ? log((double)vmax) : 0};
	/* at least a decade: cells a few percent apart look alike, not opposite */
	if (sc.hi - sc.lo < log(10.0))
		sc.lo = sc.hi - log(10.0);
	/* node changes between consecutive world ranks; g: the ranks of every
	 * node when all nodes hold the same number in one run, else -1 */
	int64_t nodes_lines = 0, g = 0, same = 1;
	for (int64_t r = 1; r <= W; r++) {
		if (r < W && vps_world_device(p->world, r).node == vps_world_device(p->world, r - 1).node) {
			same++;
			continue;
		}
		g = !g || g == same ? same : -1;
		same = 1;
		nodes_lines += r < W;
	}

	/* geometry, in pixels: the map is nb cells of c a side */
	const int64_t c = vps_max64(2, vps_min64(48, 640 / nb)), M = nb * c;
	const int64_t L = 72, T = 104, BW = 120, BH = 120, GAP = 12;
	const int64_t bx = L + M + GAP, by = T + M + GAP;  /* send bars, receive bars */
	const int64_t lx = bx + BW + 56, LH = vps_max64(160, vps_min64(M, 320));
	/* wide enough for the title lines whatever the world */
	const int64_t width = vps_max64(lx + 20 + 96, 720), height = vps_max64(by + BH + 44, T + LH + 60);
	char a[256], b[256], t1[VPS_UNITS_LEN];
	vps_parallel_format(vps_layout_parallel(p->a), a, sizeof(a));
	vps_parallel_format(vps_layout_parallel(p->b), b, sizeof(b));

	put(&s, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
	put(&s,
	    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%" PRId64 "\" height=\"%" PRId64 "\" viewBox=\"0 0 %" PRId64
	    " %" PRId64 "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"11\">\n",
	    width, height, width, height);
	put(&s, "<title>");
	put_text(&s, vps_layout_model(p->a)->name);
	put(&s, ": traffic of the plan from %s to %s</title>\n", a, b);
	put(&s, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
	put(&s, "<text x=\"%" PRId64 "\" y=\"20\" font-size=\"14\" font-weight=\"bold\">", L);
	put_text(&s, vps_layout_model(p->a)->name);
	put(&s, ": the traffic of a switch</text>\n");
	put(&s, "<text x=\"%" PRId64 "\" y=\"38\">from %s</text>\n", L, a);
	put(&s, "<text x=\"%" PRId64 "\" y=\"52\">to %s</text>\n", L, b);
	put(&s, "<text x=\"%" PRId64 "\" y=\"66\">", L);
	if (caption && *caption) {
		put_text(&s, caption);
		put(&s, "; ");
	}
	put(&s, "%" PRId64 " world ranks; %s moved between ranks", W, vps_format_bytes(moved, t1, sizeof(t1)));
	if (k > 1)
		put(&s, "; cells of %" PRId64 " x %" PRId64 " ranks", k, k);
	put(&s, "</text>\n");
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"middle\">destination rank</text>\n", L + M / 2,
	    T - 20);
	put(&s,
	    "<text x=\"16\" y=\"%" PRId64 "\" text-anchor=\"middle\" transform=\"rotate(-90 16 %" PRId64
	    ")\">source rank</text>\n",
	    T + M / 2, T + M / 2);

	/* the map: empty cells light grey, the rest by level */
	put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
		"\" fill=\"#f0f0f0\" stroke=\"#888888\"/>\n",
	    L, T, M, M);
	put(&s, "<g shape-rendering=\"crispEdges\">\n");
	for (int64_t i = 0; i < nb && !s.rc; i++)
		for (int64_t j = 0; j < nb && !s.rc;) {
			int64_t v = m[i * nb + j];
			if (!v) {
				j++;
				continue;
			}
			int lv = level_of(&sc, v);
			int64_t run = 1;
			if (nb > TOOLTIP_CELLS)
				while (j + run < nb && m[i * nb + j + run] && level_of(&sc, m[i * nb + j + run]) == lv)
					run++;
			char col[8];
			colour(lv, col);
			put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
				"\" fill=\"%s\"",
			    L + j * c, T + i * c, run * c, c, col);
			if (nb <= TOOLTIP_CELLS) {
				char from[64], to[64];
				block_name(i, k, W, from, sizeof(from));
				block_name(j, k, W, to, sizeof(to));
				put(&s, "><title>%s &#8594; %s: %s</title></rect>\n", from, to,
				    vps_format_bytes(v, t1, sizeof(t1)));
			} else {
				put(&s, "/>\n");
			}
			j += run;
		}
	put(&s, "</g>\n");

	/* node boundaries, where consecutive world ranks change node */
	/* node lines closer than 6 pixels would hide the cells */
	const bool draw_nodes = nodes_lines && (nodes_lines + 1) * 6 <= M;
	if (draw_nodes) {
		put(&s, "<g stroke=\"#d62728\" stroke-width=\"0.8\" stroke-opacity=\"0.6\">\n");
		for (int64_t r = 1; r < W && !s.rc; r++)
			if (vps_world_device(p->world, r).node != vps_world_device(p->world, r - 1).node) {
				double at = (double)r * (double)c / (double)k;
				put(&s, "<line x1=\"%.1f\" y1=\"%" PRId64 "\" x2=\"%.1f\" y2=\"%" PRId64 "\"/>\n", L + at, T,
				    L + at, T + M);
				put(&s, "<line x1=\"%" PRId64 "\" y1=\"%.1f\" x2=\"%" PRId64 "\" y2=\"%.1f\"/>\n", L, T + at,
				    L + M, T + at);
			}
		put(&s, "</g>\n");
	}

	/* rank labels */
	/* labels on node boundaries when nodes are regular and labels cannot
	 * fall on every rank */
	int64_t step = tick_step(W);
	if (g > 1 && step >= g)
		step = g * tick_step(W / g);
	for (int64_t r = 0; r < W && !s.rc; r += step) {
		double at = ((double)r + 0.5) * (double)c / (double)k;
		put(&s, "<text x=\"%.1f\" y=\"%" PRId64 "\" text-anchor=\"middle\">%" PRId64 "</text>\n", L + at, T - 6, r);
		put(&s, "<text x=\"%" PRId64 "\" y=\"%.1f\" text-anchor=\"end\" dominant-baseline=\"middle\">%" PRId64
			"</text>\n",
		    L - 6, T + at, r);
	}

	/* bars: sent to the right of the rows, received under the columns,
	 * on one linear scale so that the two compare */
	put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
		"\" fill=\"none\" stroke=\"#cccccc\"/>\n",
	    bx, T, BW, M);
	put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%" PRId64
		"\" fill=\"none\" stroke=\"#cccccc\"/>\n",
	    L, by, M, BH);
	put(&s, "<g shape-rendering=\"crispEdges\">\n");
	for (int64_t i = 0; i < nb && barmax && !s.rc; i++) {
		int64_t gap = c >= 6 ? 1 : 0;
		double ls = (double)BW * (double)bsend[i] / (double)barmax;
		double lr = (double)BH * (double)brecv[i] / (double)barmax;
		if (bsend[i])
			put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%.1f\" height=\"%" PRId64
				"\" fill=\"#1f77b4\"/>\n",
			    bx, T + i * c + gap, ls, c - 2 * gap);
		if (brecv[i])
			put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"%" PRId64 "\" height=\"%.1f\" fill=\"#ff7f0e\"/>\n",
			    L + i * c + gap, by, c - 2 * gap, lr);
	}
	put(&s, "</g>\n");
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" fill=\"#1f77b4\">sent</text>\n", bx, T - 6);
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" fill=\"#1f77b4\">0</text>\n", bx, T + M + 14);
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"end\" fill=\"#1f77b4\">%s</text>\n", bx + BW,
	    T + M + 14, vps_format_bytes(barmax, t1, sizeof(t1)));
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"end\" fill=\"#ff7f0e\">received</text>\n",
	    L - 6, by + 12);
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\" text-anchor=\"end\" fill=\"#ff7f0e\">%s</text>\n", L - 6,
	    by + BH, vps_format_bytes(barmax, t1, sizeof(t1)));
	if (barmax) {
		/* the mean a rank sends (and receives): the level a balanced plan has */
		double mean = (double)moved / (double)W;
		double xs = (double)bx + (double)BW * mean / (double)barmax;
		double yr = (double)by + (double)BH * mean / (double)barmax;
		put(&s, "<g stroke=\"#333333\" stroke-dasharray=\"3,3\">\n");
		put(&s, "<line x1=\"%.1f\" y1=\"%" PRId64 "\" x2=\"%.1f\" y2=\"%" PRId64 "\"/>\n", xs, T, xs, T + M);
		put(&s, "<line x1=\"%" PRId64 "\" y1=\"%.1f\" x2=\"%" PRId64 "\" y2=\"%.1f\"/>\n", L, yr, L + M, yr);
		put(&s, "</g>\n");
		put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">bars: bytes a rank sends and receives%s; dashed: the mean, %s</text>\n",
		    L, by + BH + 18, k > 1 ? ", the busiest rank of each block" : "",
		    vps_format_bytes((int64_t)mean, t1, sizeof(t1)));
	}

	/* the legend: the levels, top the largest cell */
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">bytes (log scale)</text>\n", lx, T - 14);
	if (vmax) {
		put(&s, "<g shape-rendering=\"crispEdges\">\n");
		for (int l = 0; l < LEVELS && !s.rc; l++) {
			char col[8];
			colour(l, col);
			double y0 = (double)T + (double)LH * (LEVELS - 1 - l) / LEVELS;
			put(&s, "<rect x=\"%" PRId64 "\" y=\"%.1f\" width=\"16\" height=\"%.1f\" fill=\"%s\"/>\n", lx, y0,
			    (double)LH / LEVELS + 0.5, col);
		}
		put(&s, "</g>\n");
		const int nl = 4;
		for (int i = 0; i <= nl; i++) {
			double f = (double)i / nl;
			double v = exp(sc.hi - f * (sc.hi - sc.lo));
			put(&s, "<text x=\"%" PRId64 "\" y=\"%.1f\" dominant-baseline=\"middle\">%s</text>\n", lx + 22,
			    (double)T + f * (double)LH, vps_format_bytes((int64_t)llround(v), t1, sizeof(t1)));
		}
	} else {
		put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">nothing moves</text>\n", lx, T + 12);
	}
	put(&s, "<rect x=\"%" PRId64 "\" y=\"%" PRId64 "\" width=\"16\" height=\"12\" fill=\"#f0f0f0\" stroke=\"#888888\"/>\n",
	    lx, T + LH + 10);
	put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">none</text>\n", lx + 22, T + LH + 20);
	if (nodes_lines && !draw_nodes)
		put(&s, "<text x=\"%" PRId64 "\" y=\"%" PRId64 "\">%" PRId64 " node boundaries:</text><text x=\"%" PRId64
			"\" y=\"%" PRId64 "\">too close to draw</text>\n",
		    lx, T + LH + 40, nodes_lines, lx, T + LH + 54);
	else if (nodes_lines)
		put(&s,
		    "<line x1=\"%" PRId64 "\" y1=\"%" PRId64 "\" x2=\"%" PRId64 "\" y2=\"%" PRId64
		    "\" stroke=\"#d62728\"/><text x=\"%" PRId64 "\" y=\"%" PRId64 "\">node boundary</text>\n",
		    lx, T + LH + 36, lx + 16, T + LH + 36, lx + 22, T + LH + 40);
	put(&s, "</svg>\n");
done:
	free(m);
	free(send);
	free(recv);
	free(bsend);
	free(brecv);
	if (s.rc) {
		vps_bytes_release(&s.b);
		return s.rc;
	}
	*out = s.b;
	return VPS_OK;
}
