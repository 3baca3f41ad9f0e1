/* A puts line of the shape libshardd writes, read in one pass without a JSON tree (puts_scan.c): the daemon's cost per slice. */
#ifndef SD_PUTS_SCAN_H
#define SD_PUTS_SCAN_H

#include <stddef.h>
#include <stdint.h>

#include "sd_request.h"

/* One slice of the line: what sd_req_tensor_parse and sd_req_source_parse
 * would have read from it (never inline data). */
typedef struct {
  sd_req_tensor t;         /* name and prefix point into the scan's pool */
  size_t name_len;
  sd_req_source src;
} sd_puts_slice;

typedef struct sd_puts_scan {
  int64_t id;              /* the request's "id" (a non-negative integer) */
  const char *save;        /* into pool */
  sd_puts_slice *slices;
  size_t n, cap;
  char *pool;              /* the strings, each ended by a NUL */
  char *line;              /* the line itself when the scan owns it (sd_puts_scan_take), else NULL */
  size_t len;
} sd_puts_scan;

/* 1 when line is a puts request {"op":"puts","id":N,"save":S,"slices":[...]} (keys in any order)
 * whose strings are printable ASCII with no escapes, whose numbers are non-negative integers of at
 * most 15 digits, each slice object holding only a put's region fields (name, dtype, shape, start,
 * count, index, prefix, region, offset, deferred), none twice, none null, and every slice passing
 * the checks of sd_req_tensor_parse (with the largest limits, SD_NAME_MAX and SD_MAX_DIMS) and of
 * sd_req_source_parse: then *out holds them (free with sd_puts_scan_free). 0 for anything else,
 * and when out of memory, with *out empty: the caller reads such a line with sd_msg_parse and the
 * field getters, which accept what this accepts with the same values and say what is wrong with
 * the rest. At most SD_PUTS_MAX slices. Pure. */
int sd_puts_scan_line(const char *line, size_t len, sd_puts_scan *out);
/* Takes over line (malloc'd, len bytes) into a scan that answered 1, so its owner can read the
 * line the slow way later (the daemon's configured limits are below the scan's). */
void sd_puts_scan_take(sd_puts_scan *p, char *line, size_t len);
/* 1 when every slice of the scan is within a daemon's configured limits (names of at most
 * max_name_len bytes, at most max_dims dimensions), below the scan's own; 0: read the line with
 * sd_msg_parse, whose checks name the slice over them. */
int sd_puts_scan_fits(const sd_puts_scan *p, size_t max_name_len, size_t max_dims);
void sd_puts_scan_free(sd_puts_scan *p);

#endif
