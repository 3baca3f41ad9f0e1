/* GET /metrics over HTTP (libmicrohttpd on its own thread), rendered on the event loop: metrics_listen. */
#ifndef SD_METRICS_HTTP_H
#define SD_METRICS_HTTP_H

#include "daemon.h"
#include "sd_error.h"

typedef struct sd_metrics_http sd_metrics_http;

/* Binds addr ("HOST:PORT", "[IPV6]:PORT"; port 0 picks a free one, logged)
 * and serves GET /metrics from an HTTP thread. A bind failure is an error
 * naming addr. From the loop thread. */
int sd_metrics_http_start(sd_daemon *d, const char *addr, sd_metrics_http **out, sd_error *err);
/* Stops the HTTP thread (a scrape waiting on the loop gets 503) and closes
 * the loop's handle; h is freed once that handle is closed. From the loop
 * thread, before the loop closes. NULL is a no-op. */
void sd_metrics_http_stop(sd_metrics_http *h);

#endif
