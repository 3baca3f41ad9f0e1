/* Daemon settings: defaults and command-line parsing. */
#ifndef SD_CONFIG_H
#define SD_CONFIG_H

#include <stddef.h>
#include <stdio.h>

#include "log.h"
#include "sd_error.h"

typedef struct {
  char *root;             /* checkpoint root; absolute after sd_config_prepare_root */
  char *socket_path;
  sd_log_level log_level;
  size_t max_line;        /* longest request line, '\n' excluded */
  unsigned queue_depth;   /* io_uring entries */
  unsigned keep_results;  /* finished saves remembered for late `wait`s */
} sd_config;

/* Fills c from argv over the defaults. Returns 0 to run, or 1 when the
 * process should exit now with *exit_code (after --help, --version or a
 * usage error, which has been printed). */
int sd_config_parse(sd_config *c, int argc, char **argv, int *exit_code);
/* Creates the root (and missing parents) and makes c->root absolute. */
int sd_config_prepare_root(sd_config *c, sd_error *err);
void sd_config_free(sd_config *c);
void sd_config_usage(FILE *out);

#endif
