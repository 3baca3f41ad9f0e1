/* Writes a planned checkpoint into a temporary sibling folder with io_uring and publishes it atomically. */
#ifndef SD_PUBLISH_H
#define SD_PUBLISH_H

#include <stddef.h>
#include <stdint.h>
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
} sd_write_op;

typedef struct {
  const char *name;        /* plain file name, checked with sd_path_check_name */
  const uint8_t *data;
  size_t len;
} sd_artifact;

/* Called once every data byte has been written: the sources are never read
 * again, so a rank's shared memory may be reused ("released" event). */
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
  const sd_plan *plan;     /* file names, headers, sizes */
  const sd_write_op *ops;  /* data writes; everything must stay valid until done */
  size_t nops;
  const sd_artifact *artifacts;
  size_t nartifacts;
  const char *index_json;  /* NULL when plan->needs_index == 0 */
  size_t index_len;
  const char *tag;         /* save id, for logs and the temporary folder name */
  sd_publish_released_cb on_released; /* may be NULL */
  sd_publish_done_cb on_done;
  void *ud;
} sd_publish_req;

int sd_writer_init(sd_writer **out, uv_loop_t *loop, unsigned queue_depth, sd_error *err);
/* Cancels what is in flight (each gets its done callback with SHUTTING_DOWN)
 * and frees the writer once the ring is drained; cb may be NULL. */
void sd_writer_close(sd_writer *w, void (*cb)(void *ud), void *ud);

/* Copies what it needs from req except the ops' sources, plan and index. */
int sd_publish_start(sd_writer *w, const sd_publish_req *req, sd_publish **out, sd_error *err);
/* Fails the publish with code/why; on_done follows asynchronously. */
void sd_publish_cancel(sd_publish *p, int code, const char *why);
uint64_t sd_publish_bytes_written(const sd_publish *p);
uint64_t sd_publish_bytes_total(const sd_publish *p);

#endif
