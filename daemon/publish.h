/* Writes a planned checkpoint into a temporary sibling folder with io_uring and publishes it atomically. */
#ifndef SD_PUBLISH_H
#define SD_PUBLISH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "sd_error.h"
#include "sd_format.h"

/* ------------------------------------------------------------------------ *
 * Paths beneath the root (pathsafe.c). Nothing is created or followed
 * outside the root: resolution uses openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_SYMLINKS), so a symlink anywhere on the way is refused.
 * ------------------------------------------------------------------------ */
#define SD_REL_PATH_MAX 1024

int sd_root_open(const char *root, int *fd, sd_error *err);
/* Relative, no leading '/', no "..", "." or empty part, bounded: SHARDD_E_BAD_PATH. */
int sd_path_check_rel(const char *rel, sd_error *err);
/* A plain file name (no '/', not "." or ".."), for `file` artifacts. */
int sd_path_check_name(const char *name, sd_error *err);
/* *exists = 1 when ROOT/rel exists; a symlink on the way fails with BAD_PATH. */
int sd_path_exists(int root_fd, const char *rel, int *exists, sd_error *err);
/* Removes temporary folders a crashed daemon left anywhere under the root. */
int sd_cleanup_stale(int root_fd, sd_error *err);
/* Only those whose name starts with owner_prefix: on a root shared by peer
 * daemons, another node's folder may belong to a save still in flight. */
int sd_cleanup_stale_owned(int root_fd, const char *owner_prefix, sd_error *err);

/* ------------------------------------------------------------------------ *
 * The writer: one io_uring per daemon, its completions delivered on the
 * libuv loop through an eventfd, so the loop never blocks on a write.
 * ------------------------------------------------------------------------ */
typedef struct sd_writer sd_writer;
typedef struct sd_publish sd_publish;

typedef struct {
  uint32_t file;           /* index into plan->files */
  uint64_t file_offset;    /* absolute offset in that file */
  const uint8_t *src;      /* shm mapping or heap; valid until the done callback */
  uint64_t len;
  uint32_t flags;          /* SD_WOP_* */
  uint32_t slice;          /* the caller's label (save.c: which slice it copies) */
} sd_write_op;

/* src lies in a client's MAP_SHARED mapping. When a span of the request
 * holds it, its bytes are read with preadv from the segment's descriptor:
 * none of its pages enters the daemon's page tables, and a segment the
 * client shrank reads short instead of faulting. Otherwise they are copied
 * from the mapping under a SIGBUS guard, and the pages read are dropped from
 * the daemon's page tables. Either way the daemon's resident memory stays at
 * its staging size however large the checkpoint. Never set it for private
 * (heap) memory: dropping those pages would zero them. */
#define SD_WOP_SHARED 1u

/* A client's shared-memory segment: mapped at base, len bytes, readable
 * through fd. */
typedef struct {
  const uint8_t *base;
  uint64_t len;
  int fd;
} sd_shm_span;

typedef struct {
  const char *name;        /* plain file name, checked with sd_path_check_name */
  const uint8_t *data;
  size_t len;
} sd_artifact;

/* Called once every data byte has been copied out of its source (into the
 * staging buffers, usually well before it is on disk): the sources are never
 * read again, so a rank's shared memory may be reused ("released" event). */
typedef void (*sd_publish_released_cb)(sd_publish *pub, void *ud);
/* Called exactly once: err is NULL and final_path the absolute published
 * folder on success; otherwise nothing was published and the temporary
 * folder is gone. The publish object is freed right after it returns. */
typedef void (*sd_publish_done_cb)(sd_publish *pub, void *ud, const sd_error *err,
                                   const char *final_path);

typedef struct {
  int root_fd;
  const char *root_path;   /* absolute, for final_path */
  const char *rel_dir;     /* passed sd_path_check_rel */
  int overwrite;           /* replace an existing ROOT/rel_dir atomically */
  unsigned file_mode;      /* checkpoint files (0: 0644), set exactly, whatever the umask */
  unsigned dir_mode;       /* the checkpoint folder (0: 0755) */
  int record_owner;        /* set owner_uid on the folder (owner.h); a failure is logged, not fatal */
  uid_t owner_uid;
  const sd_plan *plan;     /* file names, headers, sizes */
  const sd_write_op *ops;  /* data writes; everything must stay valid until done */
  size_t nops;
  const sd_shm_span *spans; /* segments SD_WOP_SHARED sources lie in (copied; fds kept open until done) */
  size_t nspans;
  const sd_artifact *artifacts;
  size_t nartifacts;
  const char *index_json;  /* NULL when plan->needs_index == 0 */
  size_t index_len;
  /* Streaming: ops[i] may be read only once op_ready[i] is set (the caller
   * sets flags, then calls sd_publish_poke); NULL: every source is ready.
   * Staging waits for whole stretches, so writes stay large and aligned. */
  const uint8_t *op_ready;
  int hold;                /* write and fsync, but publish only after sd_publish_unhold */
  const char *tag;         /* save id, for logs and the temporary folder name */
  sd_publish_released_cb on_released; /* may be NULL */
  sd_publish_done_cb on_done;
  void *ud;
} sd_publish_req;

/* Data goes through staging buffers: copied from the sources (on a worker
 * thread, one copy at a time) into aligned chunks registered with the ring,
 * then written with O_DIRECT in whole aligned blocks; the staging size bounds
 * the writer's memory however many saves are in flight. */
#define SD_STAGING_DEFAULT_MIB 128
#define SD_STAGING_CHUNK (4u << 20)  /* bytes per staging buffer (and per write) */

typedef struct {
  unsigned queue_depth;    /* io_uring entries; 0: 64 */
  uint64_t staging_bytes;  /* 0: SD_STAGING_DEFAULT_MIB MiB; at least two chunks are used */
  uint32_t chunk_bytes;    /* 0: SD_STAGING_CHUNK; rounded up to 4 KiB (tests use small ones) */
  int buffered;            /* 1: never O_DIRECT (the fallback, forced) */
} sd_writer_opts;

int sd_writer_init_opts(sd_writer **out, uv_loop_t *loop, const sd_writer_opts *o, sd_error *err);
/* sd_writer_init_opts with the default staging. */
int sd_writer_init(sd_writer **out, uv_loop_t *loop, unsigned queue_depth, sd_error *err);
/* Cancels what is in flight (each gets its done callback with SHUTTING_DOWN)
 * and frees the writer once the ring is drained; cb may be NULL. */
void sd_writer_close(sd_writer *w, void (*cb)(void *ud), void *ud);

/* What the writer has done since it started (status, tests, benchmarks). */
typedef struct {
  uint64_t writes_direct;    /* data writes through O_DIRECT */
  uint64_t writes_buffered;  /* data writes through the page cache (fallback) */
  uint64_t writes_fixed_buf; /* ... from a buffer registered with the ring */
  uint64_t writes_fixed_file;/* ... to a registered file */
  uint64_t copy_trips;       /* trips to the copy worker */
  uint64_t staging_bytes;    /* staging allocated now */
  uint64_t staging_peak;     /* staging allocated at most */
  uint64_t staging_max;      /* the bound */
  uint64_t bytes_direct;     /* bytes the kernel took through O_DIRECT (with last-block padding) */
  uint64_t bytes_buffered;   /* ... through the page cache */
  int registered;            /* staging buffers are registered with the ring (0: plain writes) */
} sd_writer_stats;

void sd_writer_get_stats(const sd_writer *w, sd_writer_stats *out);

/* Copies what it needs from req except the ops' sources, plan and index. */
int sd_publish_start(sd_writer *w, const sd_publish_req *req, sd_publish **out, sd_error *err);

/* The atomic step of every publish: PARENT/tmp becomes PARENT/base (rel_dir
 * names it in messages), exchanged with the checkpoint there when overwrite
 * allows (*exchanged = 1: the old one now sits under tmp), retried without
 * exchange when that one went away meanwhile. exists or io_error. */
int sd_publish_swap_in(int parent_fd, const char *tmp, const char *base, const char *rel_dir, int overwrite,
                       int *exchanged, sd_error *err);
/* The whole publish of a finished temporary folder, for callers on a worker
 * thread (the multi-node leader): the folder's fsync, sd_publish_swap_in, the
 * parent's fsync, then the replaced checkpoint's removal (both logged, not
 * failures: the new checkpoint is in place). *renamed = 1 once swapped in.
 * sd_publish_start's ring-driven path takes the same steps asynchronously. */
int sd_publish_dir(int parent_fd, int tmp_fd, const char *tmp, const char *rel_dir, int overwrite,
                   const char *tag, int *renamed, sd_error *err);
/* Fails the publish with code/why; on_done follows asynchronously. */
void sd_publish_cancel(sd_publish *p, int code, const char *why);
/* More op_ready flags are set: stage what became ready. */
void sd_publish_poke(sd_publish *p);
/* Every source is final: the publish may rename once all is durable. */
void sd_publish_unhold(sd_publish *p);
uint64_t sd_publish_bytes_written(const sd_publish *p);
uint64_t sd_publish_bytes_total(const sd_publish *p);

#endif
