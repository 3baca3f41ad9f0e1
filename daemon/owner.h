/* Who committed a checkpoint: the uid recorded as an extended attribute on its folder. */
#ifndef SD_OWNER_H
#define SD_OWNER_H

#include <sys/types.h>

#include "sd_error.h"

/* "user.shardd.owner" (decimal uid): readable by every user, writable by the
 * folder's owner, i.e. the daemon; kept by rename, so it travels with the
 * published folder. tmpfs before Linux 6.6 and some network file systems
 * refuse user.* attributes: a root daemon then falls back to
 * "trusted.shardd.owner". No file of the checkpoint changes. */
#define SD_OWNER_XATTR "user.shardd.owner"
#define SD_OWNER_XATTR_TRUSTED "trusted.shardd.owner"

/* Records uid on the folder dirfd; 0, or -errno when neither attribute could be set. */
int sd_owner_record(int dirfd, uid_t uid);
/* 1 with *uid set, 0 when the folder has no recorded owner, -errno on error. */
int sd_owner_read(int dirfd, uid_t *uid);

/* The recorded owner of ROOT/rel (already known to exist): *found 0 when it
 * has none. A symlink on the way is refused as everywhere beneath the root. */
int sd_owner_of(int root_fd, const char *rel, int *found, uid_t *uid, sd_error *err);

#endif
