/* One daemon per root, and one per node name on a root that peer daemons share (rootlock.c). */
#ifndef SD_ROOTLOCK_H
#define SD_ROOTLOCK_H

#include "pathsafe.h"
#include "sd_error.h"

/* The lock file at the top of the root. Its name is reserved (sd_path_check_rel). */
#define SD_LOCK_NAME SD_LOCK_PREFIX

/* Takes the root for this process until it exits (the kernel drops the
 * locks of a dead process, so a crash never leaves the root held):
 * - node NULL (a single-node daemon): the whole root, exclusively;
 * - node set (a daemon with peers): the root shared with other daemons with
 *   peers, and the node name exclusively.
 * Refused with SHARDD_E_CONFLICT naming the root and the holder's pid.
 * *lock_fd is kept open for the process's life: POSIX record locks end
 * when any descriptor of the file is closed, so nothing else opens it. */
int sd_root_lock(int root_fd, const char *root_path, const char *node, int *lock_fd, sd_error *err);

#endif
