/* A save's guards: inline bytes held in memory (per save and daemon-wide) and who may overwrite a checkpoint. */
#ifndef SD_SAVE_GUARD_H
#define SD_SAVE_GUARD_H

#include "save.h"

/* limit_exceeded naming max_inline_bytes_per_save or max_inline_bytes when
 * len more inline bytes would pass it; `what` ("tensor", "file") and `name`
 * say whose bytes in the message. */
int sd_save_inline_check(const sd_save *save, const char *what, const char *name, uint64_t len, sd_error *err);
/* Counts len bytes the save now holds. */
void sd_save_inline_add(sd_save *save, uint64_t len);
/* The save ends: its bytes no longer count. */
void sd_save_inline_release(sd_save *save);
/* permission_denied unless uid may replace ROOT/dir (which exists): its
 * recorded owner, a member of trusted_group, or, for a folder without an
 * owner, root or the daemon's uid. */
int sd_save_may_overwrite(sd_daemon *d, uid_t uid, int trusted_member, const char *dir, sd_error *err);
/* conflict when dir lies inside (or holds) another save's destination in
 * flight, or inside a committed checkpoint; permission_denied when it lies
 * under a folder shardd made for another uid (sd_owner_check_place). */
int sd_save_may_place(sd_daemon *d, uid_t uid, int trusted_member, const char *dir, sd_error *err);

#endif
