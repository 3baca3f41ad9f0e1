/* Deleting checkpoints and keep_last (retention.c): only shardd's own folders, only by their owner, renamed away atomically. */
#ifndef SD_RETENTION_H
#define SD_RETENTION_H

#include <sys/types.h>
#include <uv.h>

#include "sd_error.h"

#include "pathsafe.h"

/* 1 when ROOT/rel is the destination of a save in flight (it must not be
 * deleted under it); set by the caller, who knows the saves. */
typedef int (*sd_retention_busy_fn)(void *ud, const char *rel);

/* ROOT/rel is a checkpoint shardd wrote: a folder of the daemon's uid, with a
 * recorded owner (owner.h) and a .safetensors file or index in it. Sets *owner.
 * not_found, not_a_checkpoint, bad_path (a symlink on the way) or io_error. */
int sd_retention_check(int root_fd, const char *rel, uid_t *owner, sd_error *err);

/* The `delete` op: rel (passed sd_path_check_rel) checked as above and owned
 * by uid (else permission_denied), renamed to a hidden name in its parent,
 * the parent fsynced; its contents are then removed on a worker thread of
 * loop. Once this returns 0 the checkpoint is gone from its name, durably. */
int sd_retention_delete(uv_loop_t *loop, int root_fd, const char *rel, uid_t uid, sd_error *err);

/* keep_last: in the parent folder of rel (just committed, always kept), the
 * checkpoints owned by uid beyond the newest n, newest by the folder's ctime
 * (set by the publishing rename, which no user can change), are deleted as
 * above. Folders not passing sd_retention_check, of other owners, or busy are
 * never touched. Returns how many were deleted, or a negative code. */
int sd_retention_keep_last(uv_loop_t *loop, int root_fd, const char *rel, uid_t uid, unsigned n,
                           sd_retention_busy_fn busy, void *ud, sd_error *err);

#endif
