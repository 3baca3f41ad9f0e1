/* The atomic step of a publish (publish_swap.c): swap a finished temporary folder in, fsynced. */
#ifndef SD_PUBLISH_SWAP_H
#define SD_PUBLISH_SWAP_H

#include <limits.h>

#include "sd_error.h"

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
/* The temporary folder's name beside base: SD_TMP_PREFIX, base and tag
 * (cleaned to [A-Za-z0-9._-]), the pid and counter. */
void sd_publish_tmp_name(char name[NAME_MAX + 1], const char *base, const char *tag, unsigned long counter);

#endif
