/* The daemon's one io_uring (writer_ring.c, with writer_copy.c, writer_pin.c, writer_raw.c): publish and file-set jobs, staged or zero-copy, and the multi-node path's raw writes and fsyncs. */
#ifndef SD_WRITER_H
#define SD_WRITER_H

#include <stdint.h>
#include <sys/uio.h>
#include <uv.h>

#include "fdpool.h"
#include "sd_error.h"
#include "staging.h"

/* ------------------------------------------------------------------------ *
 * The writer: one io_uring per daemon, its completions delivered on the
 * libuv loop through an eventfd, so the loop never blocks on a write.
 * ------------------------------------------------------------------------ */
typedef struct sd_writer sd_writer;

/* Data goes through staging buffers: copied from the sources (on libuv's
 * worker threads, up to copy_threads trips at once) into aligned chunks registered with the ring,
 * then written with O_DIRECT in whole aligned blocks; the staging size bounds
 * the writer's memory however many saves are in flight. */
#define SD_STAGING_DEFAULT_MIB 128
#define SD_STAGING_CHUNK (4u << 20)  /* bytes per staging buffer (and per write) */

typedef struct {
  unsigned queue_depth;    /* io_uring entries; 0: 64 */
  uint64_t staging_bytes;  /* 0: SD_STAGING_DEFAULT_MIB MiB; at least two chunks are used */
  uint32_t chunk_bytes;    /* 0: SD_STAGING_CHUNK; rounded up to 4 KiB (tests use small ones) */
  int buffered;            /* 1: never O_DIRECT (the fallback, forced) */
  unsigned copy_threads;   /* copy trips in flight at once; 0: sd_writer_default_copy_threads() */
  unsigned max_open_files; /* shard files its jobs hold open at once (sd_writer_fdpool); 0: no cap */
} sd_writer_opts;

/* The default copy_threads: the online cores, at most this many. */
#define SD_COPY_THREADS_DEFAULT_MAX 8
unsigned sd_writer_default_copy_threads(void);

int sd_writer_init_opts(sd_writer **out, uv_loop_t *loop, const sd_writer_opts *o, sd_error *err);
/* sd_writer_init_opts with the default staging. */
int sd_writer_init(sd_writer **out, uv_loop_t *loop, unsigned queue_depth, sd_error *err);
/* Cancels what is in flight (each gets its done callback with SHUTTING_DOWN)
 * and frees the writer once the ring is drained; cb may be NULL. */
void sd_writer_close(sd_writer *w, void (*cb)(void *ud), void *ud);

/* What the writer has done since it started (status, tests, benchmarks). */
typedef struct {
  uint64_t writes_odirect;   /* data writes through O_DIRECT */
  uint64_t writes_buffered;  /* data writes through the page cache (fallback) */
  uint64_t writes_fixed_buf; /* ... from a buffer registered with the ring */
  uint64_t writes_fixed_file;/* ... to a registered file */
  uint64_t writes_zero_copy; /* ... straight from a client's segment, no staging chunk (publishes and file sets; raw requests never) */
  uint64_t copy_trips;       /* trips to the copy workers */
  uint64_t copy_trips_peak;  /* trips with the copy workers at once, at most */
  unsigned copy_threads;     /* the bound on that */
  uint64_t staging_bytes;    /* staging allocated now */
  uint64_t staging_peak;     /* staging allocated at most */
  uint64_t staging_max;      /* the bound */
  uint64_t bytes_odirect;    /* bytes the kernel took through O_DIRECT (with last-block padding) */
  uint64_t bytes_buffered;   /* ... through the page cache */
  int registered;            /* staging buffers are registered with the ring (0: plain writes) */
  uint64_t pinned_bytes;     /* clients' segments registered with the ring now (sd_writer_pin) */
  unsigned files_open;       /* shard files open for writing now (sd_writer_fdpool) */
  unsigned files_open_peak;  /* ... the most at once since the start */
  unsigned max_open_files;   /* the cap on that (0: none) */
  uint64_t files_reopened;   /* idle files closed to make room under the cap (opened again when written) */
} sd_writer_stats;

void sd_writer_get_stats(const sd_writer *w, sd_writer_stats *out);

/* The descriptors of the files the writer's jobs write by name (fdpool.h):
 * one cap, max_open_files, for every save in flight. */
sd_fdpool *sd_writer_fdpool(sd_writer *w);

/* Registers a client's sealed segment mapped at base (len bytes) with the
 * ring, so its zero-copy writes go as fixed-buffer writes (sd_staging_pin_*),
 * on a worker thread: pinning faults in every page, seconds for some GiB of
 * a sparse segment, and the loop serves everyone meanwhile. cb gets its pin
 * on the loop (0: left unpinned), once; the mapping must stay until then.
 * -1: it stays unpinned, no callback. Unpinning a closing writer does
 * nothing: the ring's end releases every buffer. */
typedef void (*sd_writer_pin_cb)(void *ud, int pin);
int sd_writer_pin_start(sd_writer *w, uint8_t *base, uint64_t len, sd_writer_pin_cb cb, void *ud);
void sd_writer_unpin(sd_writer *w, int pin, uint64_t len);

/* ------------------------------------------------------------------------ *
 * Writer jobs (writer_ring.c, writer_copy.c): a job hands the ring one request at a time and
 * hears back once each request is whole (short writes are finished by the
 * writer) or failed. Data reaches the ring straight from a client's segment
 * (zero-copy: the job's own pieces, direct.c) or through staging chunks: the
 * writer lends the job an idle chunk (stage), a copy worker fills it off
 * the loop thread (fill; several chunks of one job may be filled at once,
 * on different threads, and come back in any order), the job gets it back (filled) and hands its write
 * to the ring (next), then returns the chunk (sd_writer_chunk_put).
 * ------------------------------------------------------------------------ */
#define SD_IO_CHUNK (16u << 20) /* largest single write handed to the ring */

typedef enum { SD_IO_WRITE, SD_IO_FSYNC } sd_io_kind;

/* How the writer counts a data write (sd_writer_stats): the job says it in the request it hands back, so the
 * byte counts of its completions follow the same answer. A piece that resumes a chunk already counted (one whose
 * direct write was refused goes out again through the page cache) is not counted again, and its bytes count as
 * buffered. */
typedef enum { SD_IO_UNCOUNTED, SD_IO_COUNT_BUFFERED, SD_IO_COUNT_ODIRECT } sd_io_count;

typedef struct sd_wjob sd_wjob;

typedef struct sd_io {
  sd_io_kind kind;
  int fd;                  /* a fixed-file slot when fixed is set */
  int fixed;
  int buf_index;           /* registered buffer holding src, or -1 (preset) */
  uint32_t tag;            /* the job's own label (a file index) */
  sd_io_count count;       /* data writes: how the writer counts this one (preset SD_IO_UNCOUNTED) */
  uint64_t off;            /* file offset of src[0] */
  const uint8_t *src;
  uint32_t len;            /* <= SD_IO_CHUNK */
  /* A gathered write (writev) instead of src: iovcnt entries, len bytes in
   * all, the job's memory until complete. A short write advances iov (and
   * edits the entry it stopped in) past what went out. */
  struct iovec *iov;
  int iovcnt;
  sd_chunk *chunk;         /* the staging chunk src lies in, if any */
  void *req;               /* the job's own pointer to what io is part of */
  /* writer-private */
  uint32_t done;           /* bytes already written by earlier short writes */
  sd_wjob *job;
  struct sd_io *next;
} sd_io;

typedef struct {
  /* Fill io (kind, fd, tag, off, src, len, ...) with the next request, or
   * return 0 when the job has nothing ready. Must not call user callbacks. */
  int (*next)(sd_wjob *job, sd_io *io);
  /* A request ended: res is its full length or fsync's 0 on success, else
   * -errno (io->done then says how far a write got). Must not call user
   * callbacks: the writer is mid-batch. */
  void (*complete)(sd_wjob *job, const sd_io *io, int res);
  /* Bytes the kernel took, for every positive write result (short ones
   * too); io->done does not count them yet. */
  void (*progress)(sd_wjob *job, const sd_io *io, uint32_t bytes);
  /* Loop thread: take chunk c for the next stretch of data (set c->file,
   * off, len, cursor), or return 0 when nothing is left to stage now. */
  int (*stage)(sd_wjob *job, sd_chunk *c);
  /* Copy worker thread: fill c->buf. Reads only what stays unchanged while
   * the job lives; touches nothing the loop thread or another fill writes. */
  void (*fill)(sd_wjob *job, sd_chunk *c);
  /* Loop thread: c is back from the worker, filled or with c->fault set.
   * Must not call user callbacks. */
  void (*filled)(sd_wjob *job, sd_chunk *c);
  /* Called after each batch of completions and after a kick: the safe
   * point to change phase, call user callbacks, or detach and free. */
  void (*poll)(sd_wjob *job);
  /* Fail with code (the writer is closing: SHARDD_E_SHUTTING_DOWN; no
   * staging memory: SHARDD_E_NO_MEMORY) and why. */
  void (*fail)(sd_wjob *job, int code, const char *why);
} sd_wjob_ops;

struct sd_wjob {
  const sd_wjob_ops *ops;
  sd_writer *w;
  unsigned inflight;       /* requests on the ring (read-only for the job) */
  unsigned filling;        /* chunks with the copy workers (read-only for the job) */
  int exhausted;           /* writer-private: next() said 0 this round */
  int staged_all;          /* writer-private: stage() said 0 this round */
  sd_wjob *prev, *next;
};

/* Joins the round-robin; the writer holds the loop alive while any job is attached. */
int sd_writer_attach(sd_writer *w, sd_wjob *job, sd_error *err);
/* Leaves it; only with job->inflight == 0 and job->filling == 0. */
void sd_writer_detach(sd_writer *w, sd_wjob *job);
/* Asks for a poll of every job and a fill of the ring on the next loop turn. */
void sd_writer_kick(sd_writer *w);
/* Fills the ring from every job and submits once, and hands idle staging
 * chunks to the copy workers (no user callbacks). */
void sd_writer_pump(sd_writer *w);
/* Gives a chunk back once its write is done (or will never be made). */
void sd_writer_chunk_put(sd_writer *w, sd_chunk *c);
/* A fixed-file slot for fd, or -1 (then use fd itself); unslot before close. */
int sd_writer_file_slot(sd_writer *w, int fd);
void sd_writer_file_unslot(sd_writer *w, int slot);
/* 1 when the writer was told never to use O_DIRECT. */
int sd_writer_buffered(const sd_writer *w);
/* The count of a new data write to a file opened O_DIRECT or not. */
static inline sd_io_count sd_io_count_of(int odirect) { return odirect ? SD_IO_COUNT_ODIRECT : SD_IO_COUNT_BUFFERED; }

/* ------------------------------------------------------------------------ *
 * Raw requests: a write of any length (short writes and pieces past
 * SD_IO_CHUNK resumed) or an fsync, on the same ring as the publish jobs,
 * for callers that bring their own buffers (the multi-node transfer writes
 * from receive buffers and shared memory in whatever pieces arrive).
 * ------------------------------------------------------------------------ */
/* res is 0 once every byte is written or the fsync succeeded, else -errno.
 * Runs on the loop; the callback may queue more requests. */
typedef void (*sd_writer_raw_cb)(void *ud, int res);

/* 0, or -ENOMEM / -ESHUTDOWN (no callback then). buf must stay valid until
 * the callback. Requests still queued when the writer closes end with
 * -ESHUTDOWN. */
int sd_writer_raw_write(sd_writer *w, int fd, const void *buf, uint64_t len, uint64_t off, sd_writer_raw_cb cb,
                        void *ud);
int sd_writer_raw_fsync(sd_writer *w, int fd, sd_writer_raw_cb cb, void *ud);
/* Raw requests queued or in flight. */
unsigned sd_writer_raw_pending(const sd_writer *w);

#endif
