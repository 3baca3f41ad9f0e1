/* Prometheus text for `shardctl metrics` and the daemon's GET /metrics: one renderer, so both show the same families. */
#ifndef SD_PROM_H
#define SD_PROM_H

#include <jansson.h>
#include <stddef.h>

/* The text exposition format (0.0.4) of a status reply (its "saves") and
 * its "metrics" object (proto/PROTOCOL.md). With version non-NULL it starts
 * with `shardd_up 1` and `shardd_build_info{version="..."} 1`, as a scrape
 * target shows them. Returns malloc'd text (*len bytes, NUL-terminated), or
 * NULL when out of memory. */
char *sd_prom_render(const json_t *status, const json_t *metrics, const char *version, size_t *len);

#endif
