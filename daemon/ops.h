/* The protocol v1 request handlers. */
#ifndef SD_OPS_H
#define SD_OPS_H

#include "daemon.h"

struct sd_session;

/* Parses one request line and answers it on s (or later, for `wait`); a line
 * the session parsed already (s->line_req) or scanned (s->line_puts, which the session frees
 * after) comes as line NULL. */
void sd_ops_dispatch(struct sd_session *s, const char *line, size_t len);
/* The fields of a status reply ("saves", "clients", "totals", the cluster's,
 * and with with_metrics the "metrics" object) set on m; only reads d. For
 * op status and the HTTP metrics (metrics_http.c). */
void sd_ops_status_fill(sd_daemon *d, struct json_t *m, int with_metrics);

#endif
