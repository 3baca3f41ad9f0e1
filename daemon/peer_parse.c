/* A long peer frame header parsed, and freed once handled, in the thread pool, so that heartbeats and other peers never wait on it. */
#include <stdlib.h>

#include "peer_int.h"

typedef struct {
  uv_work_t req;
  sd_frame_reader *r;
  sd_peer_parsed_cb done;
  void *ud;
  int rc;
  sd_error err;
} parse_job;

static void parse_work(uv_work_t *req) {
  parse_job *j = req->data;
  j->rc = sd_frame_parse_header(j->r, &j->err);
}

static void parse_done(uv_work_t *req, int status) {
  parse_job *j = req->data;
  if (status == UV_ECANCELED && !j->rc) j->rc = sd_fail(&j->err, SHARDD_E_SHUTTING_DOWN, "the daemon is shutting down");
  j->done(j->ud, j->rc, &j->err);
  free(j);
}

int sd_peer_parse_off_loop(uv_loop_t *loop, sd_frame_reader *r, sd_peer_parsed_cb done, void *ud) {
  parse_job *j = calloc(1, sizeof *j);
  if (!j) return -1;
  *j = (parse_job){.r = r, .done = done, .ud = ud};
  j->req.data = j;
  if (uv_queue_work(loop, &j->req, parse_work, parse_done) != 0) {
    free(j);
    return -1;
  }
  return 0;
}

static void free_work(uv_work_t *req) { json_decref(req->data); }

static void free_done(uv_work_t *req, int status) {
  (void)status;
  free(req);
}

void sd_peer_free_later(uv_loop_t *loop, json_t *h) {
  /* jansson's reference counts are atomic: whatever the handler kept of h stays alive. */
  uv_work_t *req = malloc(sizeof *req);
  if (req) req->data = h;
  if (!req || uv_queue_work(loop, req, free_work, free_done) != 0) {
    free(req);
    json_decref(h);
  }
}
