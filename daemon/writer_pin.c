/* The writer's pinning: clients' sealed segments registered with the ring, and the staging kept while any is (its give-back timer). */
#include <stdlib.h>

#include "writer_int.h"

static void on_trim(uv_timer_t *t) {
  sd_writer *w = t->data;
  /* Clients' segments pinned: a job is attached and saves again soon; its staging stays, already faulted in
   * and registered (bench_multi (Z): a save after the trim paid ~0.06 s/GiB more to get it back). */
  if (!w->jobs && w->trips_busy == 0 && w->pins_busy == 0 && w->stg.pinned == 0) sd_staging_trim(&w->stg);
}

void sd_writer_trim_later(sd_writer *w) {
  uv_timer_start(&w->trim, on_trim, SD_TRIM_MS, 0);
}

typedef struct {
  uv_work_t req;
  sd_writer *w;
  sd_pin_job job;
  sd_writer_pin_cb cb;
  void *ud;
} pin_trip;

static void pin_run(uv_work_t *req) {
  pin_trip *p = req->data;
  sd_staging_pin_register(&p->w->stg, &p->job);
}

static void pin_done(uv_work_t *req, int status) {
  (void)status; /* never cancelled: close waits for every pin to end */
  pin_trip *p = req->data;
  sd_writer *w = p->w;
  w->pins_busy--;
  int pin = sd_staging_pin_end(&w->stg, &p->job, !w->closing);
  /* A pinned arena means a job that will save: its staging is made now, at attach, not in its first
   * save (bench_multi (z) against (Z): ~0.06 s/GiB of the first save went to faulting and registering it). */
  if (pin) sd_staging_prefill(&w->stg);
  sd_writer_pin_cb cb = p->cb;
  void *ud = p->ud;
  free(p);
  if (w->closing) w->trip_back(w); /* the close may have waited for this pin */
  cb(ud, pin);
}

int sd_writer_pin_start(sd_writer *w, uint8_t *base, uint64_t len, sd_writer_pin_cb cb, void *ud) {
  if (w->closing) return -1;
  pin_trip *p = calloc(1, sizeof *p);
  if (!p) return -1;
  if (sd_staging_pin_begin(&w->stg, base, len, &p->job) != 0) {
    free(p);
    return -1;
  }
  p->w = w;
  p->cb = cb;
  p->ud = ud;
  p->req.data = p;
  if (uv_queue_work(w->loop, &p->req, pin_run, pin_done) != 0) {
    sd_staging_pin_end(&w->stg, &p->job, 0);
    free(p);
    return -1;
  }
  w->pins_busy++;
  return 0;
}

void sd_writer_unpin(sd_writer *w, int pin, uint64_t len) {
  if (w->closing) return;
  sd_staging_unpin(&w->stg, pin, len);
  if (w->stg.pinned == 0 && !w->jobs) sd_writer_trim_later(w);
}
