/* The `metrics` view of status and `shardctl metrics`: reads the daemon's counters and the saves in flight. */
#ifndef SD_METRICS_H
#define SD_METRICS_H

#include <jansson.h>

struct sd_daemon;

/* The `metrics` object of the status reply (documented in proto/PROTOCOL.md):
 * counters since start, plus gauges read from d. */
json_t *sd_metrics_json(const struct sd_daemon *d);

#endif
