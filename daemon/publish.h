/* One publish's face (publish_start.c, publish_job.c): a planned checkpoint written into a temporary sibling folder through a file set, then swapped in atomically. */
#ifndef SD_PUBLISH_H
#define SD_PUBLISH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "sd_error.h"
#include "sd_format.h"
#include "pubfill.h"
#include "publish_swap.h"
#include "writer.h"

/* ------------------------------------------------------------------------ *
 * Publishing
 * ------------------------------------------------------------------------ */
typedef struct sd_publish sd_publish;

typedef struct {
  const char *name;        /* plain file name, checked with sd_path_check_name */
  const uint8_t *data;
  size_t len;
} sd_artifact;

/* Called once every data byte has been copied out of its source (into the
 * staging buffers, usually well before it is on disk) or, for zero-copy
 * writes, written from it: the sources are never
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
  int owner_trusted;       /* with record_owner: owner_uid may save beneath others' folders (owner.h) */
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

/* Copies what it needs from req except the ops' sources, plan and index. */
int sd_publish_start(sd_writer *w, const sd_publish_req *req, sd_publish **out, sd_error *err);

/* Fails the publish with code/why; on_done follows asynchronously. */
void sd_publish_cancel(sd_publish *p, int code, const char *why);
/* More op_ready flags are set: stage what became ready. */
void sd_publish_poke(sd_publish *p);
/* Every source is final: the publish may rename once all is durable. */
void sd_publish_unhold(sd_publish *p);
uint64_t sd_publish_bytes_written(const sd_publish *p);
uint64_t sd_publish_bytes_total(const sd_publish *p);
/* Of the bytes written, those that went straight from the clients' segments
 * (zero-copy); the rest went through staging (copied). */
uint64_t sd_publish_bytes_zero_copy(const sd_publish *p);
/* Bytes gathered in one writev from several sources (not in bytes_zero_copy). */
uint64_t sd_publish_bytes_gathered(const sd_publish *p);
/* Of the staged bytes, those read from sealed memfds
 * (no preadv, no SIGBUS guard). */
uint64_t sd_publish_bytes_sealed(const sd_publish *p);

#endif
