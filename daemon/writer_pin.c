/* The writer's pinning: clients' sealed segments registered with the ring, and the staging kept while any is (its give-back timer). */
#include "writer_int.h"

static void on_trim(uv_timer_t *t) {
  sd_writer *w = t->data;
  /* Clients' segments pinned: a job is attached and saves again soon; its staging stays, already faulted in
   * and registered (bench_multi (Z): a save after the trim paid ~0.06 s/GiB more to get it back). */
  if (!w->jobs && w->trips_busy == 0 && w->stg.pinned == 0) sd_staging_trim(&w->stg);
}

void sd_writer_trim_later(sd_writer *w) {
  uv_timer_start(&w->trim, on_trim, SD_TRIM_MS, 0);
}

int sd_writer_pin(sd_writer *w, uint8_t *base, uint64_t len) {
  if (w->closing) return 0;
  int pin = sd_staging_pin(&w->stg, base, len);
  /* A pinned arena means a job that will save: its staging is made now, at attach, not in its first
   * save (bench_multi (z) against (Z): ~0.06 s/GiB of the first save went to faulting and registering it). */
  if (pin) sd_staging_prefill(&w->stg);
  return pin;
}

void sd_writer_unpin(sd_writer *w, int pin, uint64_t len) {
  if (w->closing) return;
  sd_staging_unpin(&w->stg, pin, len);
  if (w->stg.pinned == 0 && !w->jobs) sd_writer_trim_later(w);
}
