/* Paths beneath the root (pathsafe.c): checked names, openat2 without symlinks, stale temporary folders. */
#ifndef SD_PATHSAFE_H
#define SD_PATHSAFE_H

#include <limits.h>

#include "sd_error.h"

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
/* Removes temporary folders (and half-deleted checkpoints) a crashed daemon left anywhere under the root. */
int sd_cleanup_stale(int root_fd, sd_error *err);
/* Only those whose name starts with owner_prefix: on a root shared by peer
 * daemons, another node's folder may belong to a save still in flight. */
int sd_cleanup_stale_owned(int root_fd, const char *owner_prefix, sd_error *err);

/* ------------------------------------------------------------------------ *
 * Paths (pathsafe.c)
 * ------------------------------------------------------------------------ */
/* Temporary folders are named with this prefix, so a restarted daemon can
 * recognise (and remove) what a crashed one left behind. */
#define SD_TMP_PREFIX ".shardd-tmp-"
/* A checkpoint being deleted (retention.c) is first renamed to
 * PARENT/SD_DEL_PREFIX<name>-<random>: whatever a crash leaves under such a
 * name is garbage, whichever node or daemon made it. */
#define SD_DEL_PREFIX ".shardd-del-"
/* The root's lock file, ROOT/.shardd-lock (rootlock.h): no checkpoint takes the name. */
#define SD_LOCK_PREFIX ".shardd-lock"
/* Deepest folder sd_cleanup_stale and sd_path_remove_tree descend into. */
#define SD_WALK_DEPTH_MAX 64
/* Longest path under the root the sweep descends to (it logs each folder it removes by its path). */
#define SD_WALK_PATH_MAX (SD_REL_PATH_MAX + NAME_MAX + 2)

/* openat2(dirfd, path, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
 * returns the fd or -errno. */
int sd_openat_beneath(int dirfd, const char *path, int flags, unsigned mode);

/* Opens (O_RDONLY | O_DIRECTORY) the folder holding the last part of rel,
 * creating the missing folders on the way (mode 0755) when create is set.
 * *created counts the folders it made, deepest last, so a failed save can
 * remove them again with sd_path_unmake_parents. *base points into rel at
 * its last part. */
int sd_path_open_parent(int root_fd, const char *rel, int create, int *parent_fd,
                        unsigned *created, const char **base, sd_error *err);
/* Removes (if empty) the `created` deepest folders above rel's last part. */
void sd_path_unmake_parents(int root_fd, const char *rel, unsigned created);

/* Deletes dirfd/name and everything below it without following a symlink;
 * a symlink inside is unlinked, never its target. */
int sd_path_remove_tree(int dirfd, const char *name, sd_error *err);

#endif
