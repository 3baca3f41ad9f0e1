/* The writer's copy trips: idle staging chunks handed round-robin to the jobs, filled by up to copy_threads trips at once off the loop thread. */
#include <stdlib.h>
#include <unistd.h>

#include "writer_int.h"

/* Chunks per trip to the copy worker: enough to get the disk going at the
 * start of a save, few enough that the first writes leave early. With
 * several trips the staging is shared out so that every trip gets some. */
#define SD_COPY_BATCH 4

/* One trip to a copy worker: the chunks it fills, off the loop thread. */
typedef struct sd_copytrip {
  uv_work_t req;
  sd_writer *w;
  sd_chunk *batch;
  struct sd_copytrip *next; /* idle list */
} copytrip;

/* ------------------------------------------------------------------------ *
 * Staging: idle chunks go round-robin to the jobs with data left, one
 * chunk per job per turn, so a large save cannot starve a small one. Up to
 * copy_threads trips are with the copy workers at once, each with its own
 * chunks, so copying takes that many cores at most; the staging size still
 * bounds the memory, whatever the number of trips.
 * ------------------------------------------------------------------------ */
static void copy_work(uv_work_t *req) {
  copytrip *t = req->data;
  sd_bus_guard_install();
  for (sd_chunk *c = t->batch; c; c = c->next) c->job->ops->fill(c->job, c);
}

static void copy_done(uv_work_t *req, int status) {
  (void)status; /* never cancelled: close waits for every trip to end */
  copytrip *t = req->data;
  sd_writer *w = t->w;
  sd_chunk *c = t->batch;
  t->batch = NULL;
  t->next = w->idle_trips;
  w->idle_trips = t;
  w->trips_busy--;
  while (c) {
    sd_chunk *next = c->next;
    sd_wjob *j = c->job;
    c->next = NULL;
    j->filling--;
    j->ops->filled(j, c);
    c = next;
  }
  w->trip_back(w);
}

/* Up to max chunks for one trip, round-robin over the jobs; NULL when no
 * job has anything to stage now or every chunk is busy. */
static sd_chunk *stage_batch(sd_writer *w, unsigned max, int *failed) {
  sd_chunk *head = NULL, **tail = &head;
  unsigned n = 0, idle = 0; /* idle: jobs in a row that staged nothing */
  sd_wjob *j = w->stage_rr ? w->stage_rr : w->jobs;
  while (n < max && idle < w->njobs) {
    sd_wjob *nj = j->next ? j->next : w->jobs;
    if (!j->staged_all) {
      sd_chunk *c = sd_staging_get(&w->stg);
      if (!c && w->stg.busy > 0) break; /* every chunk is busy: wait for one to come back */
      if (!c) {
        /* Not one chunk could be had, and none will come back. */
        j->ops->fail(j, SHARDD_E_NO_MEMORY, "no memory for a staging buffer");
        j->staged_all = 1;
        *failed = 1;
      } else if (j->ops->stage(j, c)) {
        c->job = j;
        j->filling++;
        *tail = c;
        tail = &c->next;
        n++;
        idle = 0;
        j = nj;
        continue;
      } else {
        sd_staging_put(&w->stg, c);
        j->staged_all = 1;
      }
    }
    idle++;
    j = nj;
  }
  w->stage_rr = j;
  return head;
}

int sd_writer_stage(sd_writer *w) {
  int failed = 0;
  while (w->idle_trips && w->jobs) {
    sd_chunk *head = stage_batch(w, w->trip_batch, &failed);
    if (!head) break;
    copytrip *t = w->idle_trips;
    w->idle_trips = t->next;
    t->next = NULL;
    t->batch = head;
    if (++w->trips_busy > w->st.copy_trips_peak) w->st.copy_trips_peak = w->trips_busy;
    w->st.copy_trips++;
    if (uv_queue_work(w->loop, &t->req, copy_work, copy_done) < 0) {
      /* Cannot happen with a valid loop; fill on this thread rather than stall
       * (copy_done's trip back to the ring stages the next trip). */
      copy_work(&t->req);
      copy_done(&t->req, 0);
      break;
    }
  }
  for (sd_wjob *k = w->jobs; k; k = k->next) k->staged_all = 0;
  return failed;
}

void sd_writer_chunk_put(sd_writer *w, sd_chunk *c) {
  sd_staging_put(&w->stg, c);
}

unsigned sd_writer_default_copy_threads(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > SD_COPY_THREADS_DEFAULT_MAX ? SD_COPY_THREADS_DEFAULT_MAX : (unsigned)n;
}

int sd_writer_trips_init(sd_writer *w, unsigned ntrips, sd_error *err) {
  w->ntrips = ntrips ? ntrips : sd_writer_default_copy_threads();
  w->trips = calloc(w->ntrips, sizeof *w->trips);
  if (!w->trips) return sd_fail(err, SHARDD_E_NO_MEMORY, "writer copy trips");
  for (unsigned i = w->ntrips; i-- > 0;) {
    w->trips[i].w = w;
    w->trips[i].req.data = &w->trips[i];
    w->trips[i].next = w->idle_trips;
    w->idle_trips = &w->trips[i];
  }
  /* Half the staging on its way through the copy workers at most, the rest
   * for the ring, shared out so that every trip can have some. */
  w->trip_batch = w->stg.max / 2 / w->ntrips;
  if (w->trip_batch > SD_COPY_BATCH) w->trip_batch = SD_COPY_BATCH;
  if (w->trip_batch == 0) w->trip_batch = 1;
  w->st.copy_threads = w->ntrips;
  return 0;
}
