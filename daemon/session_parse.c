/* A long request line parsed on a worker thread, its result handed back on the loop; one a client closing meanwhile is dropped there. */
#include <stdlib.h>
#include <string.h>

#include "sd_msg.h"
#include "session_parse.h"

struct sd_line_parse {
  uv_work_t req;
  char *line;
  size_t len;
  json_t *out;
  sd_puts_scan *scan;
  sd_line_scan_limits lim;
  sd_error err;
  sd_line_parsed_cb cb;    /* NULL once orphaned */
  void *ud;
};

static void parse_work(uv_work_t *req) {
  sd_line_parse *p = req->data;
  /* A puts line of libshardd's shape costs a tenth as much scanned as parsed into a tree. */
  /* One the scan takes but the daemon would not (a descriptor came with it, a slice over the
   * configured limits) is parsed here too: on the loop, a long line's parse stalls every client. */
  p->scan = malloc(sizeof *p->scan);
  if (p->scan && sd_puts_scan_line(p->line, p->len, p->scan)) {
    if (!p->lim.with_fd && sd_puts_scan_fits(p->scan, p->lim.max_name_len, p->lim.max_dims)) {
      sd_puts_scan_take(p->scan, p->line, p->len); /* kept: limits lowered meanwhile (SIGHUP) read it as JSON */
      p->line = NULL;
      return;
    }
    sd_puts_scan_free(p->scan);
  }
  free(p->scan);
  p->scan = NULL;
  sd_msg_parse(p->line, p->len, &p->out, &p->err);
  free(p->line); /* the copy can be as long as max_line: gone before the loop sees the result */
  p->line = NULL;
}

static void parse_done(uv_work_t *req, int status) {
  (void)status; /* never cancelled */
  sd_line_parse *p = req->data;
  if (p->cb) {
    p->cb(p->ud, p->out, p->scan, p->out || p->scan ? NULL : &p->err);
  } else {
    json_decref(p->out);
    sd_line_scan_free(p->scan);
  }
  free(p);
}

void sd_line_scan_free(sd_puts_scan *scan) {
  if (!scan) return;
  sd_puts_scan_free(scan);
  free(scan);
}

sd_line_parse *sd_line_parse_start(uv_loop_t *loop, const char *line, size_t len, const sd_line_scan_limits *lim,
                                   sd_line_parsed_cb cb, void *ud) {
  sd_line_parse *p = calloc(1, sizeof *p);
  if (p) p->line = malloc(len ? len : 1);
  if (!p || !p->line) {
    free(p);
    return NULL;
  }
  memcpy(p->line, line, len);
  p->len = len;
  p->lim = *lim;
  p->cb = cb;
  p->ud = ud;
  p->req.data = p;
  if (uv_queue_work(loop, &p->req, parse_work, parse_done) != 0) {
    free(p->line);
    free(p);
    return NULL;
  }
  return p;
}

void sd_line_parse_orphan(sd_line_parse *p) { p->cb = NULL; }

/* ------------------------------------------------------------------------ *
 * Dropping a large request: freeing its values costs about what parsing
 * them did, so its last reference goes on a worker too (jansson counts
 * references atomically, and parts a save kept, like the request's id, stay
 * alive by their own).
 * ------------------------------------------------------------------------ */
typedef struct {
  uv_work_t req;
  json_t *v;
} drop_trip;

static void drop_work(uv_work_t *req) {
  drop_trip *t = req->data;
  json_decref(t->v);
}

static void drop_done(uv_work_t *req, int status) {
  (void)status;
  free(req->data);
}

void sd_line_parse_drop(uv_loop_t *loop, json_t *v) {
  drop_trip *t = v ? calloc(1, sizeof *t) : NULL;
  if (t) {
    t->v = v;
    t->req.data = t;
    if (uv_queue_work(loop, &t->req, drop_work, drop_done) == 0) return;
    free(t);
  }
  json_decref(v);
}
