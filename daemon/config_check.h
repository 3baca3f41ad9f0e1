/* Daemon settings held against the system once they are all set (config_check.c), and how a message names where a key came from. */
#ifndef SD_CONFIG_CHECK_H
#define SD_CONFIG_CHECK_H

#include <stddef.h>

#include "config.h"

/* A key's command-line flag: its name with '-' for '_'. */
void sd_config_flag_name(const sd_config_key *k, char *buf, size_t n);
/* Where key k's value came from, for messages: the option, the file line, or the default. */
void sd_config_where(const sd_config *c, const struct sd_config_src *src, const unsigned *lines,
                     const sd_config_key *k, char *buf, size_t n);
/* Group names resolved to gids, listen addresses' shape checked, so that --check-config catches
 * them before start-up does; lines[i] is the file line that set key i (may be NULL). */
int sd_config_check(sd_config *c, const unsigned *lines, sd_error *err);
/* Whether the daemon's user can do in `root` what every save does (create a folder and a file in
 * it, write, fsync, rename the folder, fsync the root), leaving nothing behind; the error names
 * the root, the user, the step and the errno. */
int sd_config_check_root(const char *root, sd_error *err);

#endif
