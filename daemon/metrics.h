/* Daemon-wide counters for `status` and `shardctl metrics`, bumped by one-line calls on the loop thread. */
#ifndef SD_METRICS_H
#define SD_METRICS_H

#include <jansson.h>
#include <stdint.h>

struct sd_daemon;

/* Upper bounds (seconds) of the save duration histogram; +Inf is implied. */
#define SD_METRICS_NBUCKETS 12
extern const double sd_metrics_buckets[SD_METRICS_NBUCKETS];

/* Everything counts from sd_metrics_start (the daemon's start). Not
 * thread-safe: call from the event loop only. */
void sd_metrics_start(void);
void sd_metrics_connection(void);           /* a client connected */
void sd_metrics_put(uint64_t bytes);        /* a put was accepted */
/* A save committed: seconds from its first begin, and of the write phase
 * (last seal to publish). */
void sd_metrics_save_committed(uint64_t files, uint64_t bytes, double seconds, double write_seconds);
void sd_metrics_save_failed(int code);      /* a save ended with SHARDD_E_* code */
void sd_metrics_reload(int ok);             /* SIGHUP handled; ok = 0 when the file was invalid */

/* The `metrics` object of the status reply (documented in proto/PROTOCOL.md):
 * counters since start, plus gauges read from d. */
json_t *sd_metrics_json(const struct sd_daemon *d);

#endif
