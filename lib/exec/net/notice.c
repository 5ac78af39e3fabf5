/* What a long wait says (vps_net_opts' notice): whom it waits for, once
 * it has lasted notice_after seconds, then every notice_every seconds or
 * never again. The network never prints: the caller's notice does. */
#include <inttypes.h>
#include <stdio.h>

#include "exec/net/net_int.h"

void vps_net_wait_begin(const struct vps_net *n, struct net_wait *w)
{
	w->start = vps_net_now();
	w->next = n && n->notice ? w->start + n->notice_after : 0;
}

bool vps_net_wait_due(const struct vps_net *n, struct net_wait *w, double t)
{
	if (!w->next || t < w->next)
		return false;
	w->next = n->notice_every > 0 ? t + n->notice_every : 0;
	return true;
}

void vps_net_say(const struct vps_net *n, const char *fmt, ...)
{
	if (!n || !n->notice)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	n->notice(n->notice_ctx, msg);
}

void vps_net_waited(const struct vps_net *n, const struct net_wait *w, double t, char *out, size_t size)
{
	snprintf(out, size, "(%.0f s so far; timeout %g s)", t - w->start, n->timeout);
}

void vps_net_names_init(struct net_names *l, char *out, size_t size)
{
	*l = (struct net_names){out, size, 0, 0, 0};
	out[0] = '\0';
}

void vps_net_names_add(struct net_names *l, const char *fmt, ...)
{
	if (l->named == NAMES_MAX) {
		l->more++;
		return;
	}
	char item[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(item, sizeof(item), fmt, ap);
	va_end(ap);
	int k = snprintf(l->out + l->len, l->size - l->len, "%s%s", l->named ? ", " : "", item);
	if (k > 0)
		l->len = l->len + (size_t)k < l->size ? l->len + (size_t)k : l->size - 1;
	l->named++;
}

void vps_net_names_end(struct net_names *l)
{
	if (l->more > 0 && l->len + 1 < l->size)
		snprintf(l->out + l->len, l->size - l->len, " and %" PRId64 " more", l->more);
}
