/* Private to the writer's parts (writer_ring.c, writer_copy.c, writer_pin.c, writer_raw.c): the one sd_writer they share, and the calls between them. */
#ifndef SD_WRITER_INT_H
#define SD_WRITER_INT_H

#include <liburing.h>
#include <uv.h>

#include "staging.h"
#include "writer.h"

/* Staging memory goes back to the system once the writer has been idle this long. */
#define SD_TRIM_MS 10000

/* The job that carries raw requests; attached while any is pending. */
typedef struct {
  sd_wjob job;
  struct sd_rawreq *wait, **wait_tail; /* the next piece not yet handed to the ring, in order */
  struct sd_rawreq *done, **done_tail; /* ended, callback not yet run */
  unsigned pending;
  int attached;
  int failing;             /* the writer is closing: what waits ends with -ESHUTDOWN */
} sd_rawjob;

struct sd_writer {
  uv_loop_t *loop;
  struct io_uring ring;
  int efd;
  uv_poll_t poll;          /* eventfd readable: completions are waiting */
  uv_async_t kick;         /* work appeared outside a completion (start, cancel) */
  uv_timer_t trim;         /* idle: give the staging memory back */
  unsigned handles_open;

  sd_staging stg;
  int buffered;            /* never O_DIRECT */
  struct sd_copytrip *trips; /* copy_threads of them (writer_copy.c) */
  struct sd_copytrip *idle_trips;
  unsigned ntrips, trips_busy;
  unsigned pins_busy;      /* segments being pinned on a worker (writer_pin.c) */
  unsigned trip_batch;     /* chunks per trip */
  sd_wjob *stage_rr;       /* the job the next staging round starts with */
  /* A copy trip is back: the ring polls its jobs and fills itself again
   * (set by writer_ring.c: the copy trips sit below it and call it no name). */
  void (*trip_back)(struct sd_writer *w);
  sd_writer_stats st;
  sd_fdpool files;         /* descriptors of files written by name, under max_open_files */

  unsigned qd;
  unsigned inflight;       /* SQEs handed to the ring and not yet reaped */
  sd_io *slots;            /* qd of them; a request holds one until it ends */
  unsigned char *slot_odirect; /* per slot: its write goes through O_DIRECT (byte counts) */
  sd_io *free_slots;
  sd_io *retry;            /* short writes to resubmit for the remainder */
  sd_io **retry_tail;

  sd_wjob *jobs;           /* round-robin list; rr is where the next fill starts */
  sd_wjob *rr;
  unsigned njobs;
  int polling;             /* inside poll_jobs: do not recurse */

  sd_rawjob raw;           /* writer_raw.c */

  int closing;
  void (*close_cb)(void *ud);
  void *close_ud;
};

/* writer_copy.c: the copy trips. */
/* copy_threads trips (0: sd_writer_default_copy_threads()), each with its share of the staging. */
int sd_writer_trips_init(sd_writer *w, unsigned ntrips, sd_error *err);
/* Hands idle staging chunks to the copy workers; 1 when it failed a job that
 * wants a poll (the ring kicks itself then). */
int sd_writer_stage(sd_writer *w);

/* writer_pin.c: the staging's give-back timer, held off while clients' segments are pinned. */
void sd_writer_trim_later(sd_writer *w);

#endif
