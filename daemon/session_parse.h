/* A long request line parsed on a worker thread (session_parse.c), so the loop serves every other client meanwhile. */
#ifndef SD_SESSION_PARSE_H
#define SD_SESSION_PARSE_H

#include <jansson.h>
#include <stddef.h>
#include <uv.h>

#include "sd_error.h"
#include "sd_puts_scan.h"

/* Lines longer than this are parsed off the loop. jansson reads a few tens
 * of MB/s, and much less for a line of many small values (a 15 MB object of
 * 1.25M keys held the loop 7 s on a loaded test machine), so a long line
 * parsed on the loop stalls every other client; a short one costs less
 * than the trip to a worker. */
#define SD_PARSE_OFF_LOOP (16u << 10)

typedef struct sd_line_parse sd_line_parse;

/* What decides whether a scanned puts line may be used as scanned: the daemon's limits, and
 * whether a descriptor came with the line (puts takes none). */
typedef struct {
  size_t max_name_len, max_dims;
  int with_fd;
} sd_line_scan_limits;

/* scan: a puts line of libshardd's shape, read by sd_puts_scan_line, which keeps the line (the
 * callee's: free it with sd_line_scan_free); else req: the parsed request object (the reference
 * is the callee's), or NULL and err (bad_request, as sd_msg_parse says it). */
typedef void (*sd_line_parsed_cb)(void *ud, json_t *req, sd_puts_scan *scan, const sd_error *err);

/* Copies line (len bytes) and parses it on libuv's thread pool; cb runs on
 * the loop, once. NULL when it could not start (no memory, the pool
 * refused): the caller parses it itself. */
sd_line_parse *sd_line_parse_start(uv_loop_t *loop, const char *line, size_t len, const sd_line_scan_limits *lim,
                                   sd_line_parsed_cb cb, void *ud);
/* Frees a scan cb was given (NULL: nothing). */
void sd_line_scan_free(sd_puts_scan *scan);
/* The caller is going away: cb is never called; the parse frees itself. */
void sd_line_parse_orphan(sd_line_parse *p);
/* Drops a reference to v (may be NULL) on a worker: the last one of a long
 * line's request frees as many values as its parse made. */
void sd_line_parse_drop(uv_loop_t *loop, json_t *v);

#endif
