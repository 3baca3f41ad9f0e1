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

/* A folder shardd made on the way to a uid's checkpoint (not a checkpoint
 * itself) is that uid's: the uid is recorded on it under this name, with the
 * same trusted.* fallback. */
#define SD_FOLDER_XATTR "user.shardd.folder"
#define SD_FOLDER_XATTR_TRUSTED "trusted.shardd.folder"

/* Whether uid may publish at ROOT/rel, judged on the folders above it that
 * exist (README "Who may save where"):
 * - none may be a checkpoint (a recorded owner, or an index or
 *   model.safetensors inside): SHARDD_E_CONFLICT naming it and its owner;
 * - none may be a folder shardd made for another uid, unless trusted_member:
 *   SHARDD_E_PERMISSION naming it and its uid.
 * Folders nobody recorded (made by hand) are open to every uid. */
int sd_owner_check_place(int root_fd, const char *rel, uid_t uid, int trusted_member, sd_error *err);
/* Records uid on the `created` deepest folders above rel's last part (those
 * sd_path_open_parent just made); a failure is logged, not fatal. */
void sd_owner_mark_made(int root_fd, const char *rel, unsigned created, uid_t uid);

#endif
