/* Private to config.c, config_check.c and config_apply.c: where each setting came from, and the digits reader they share. */
#ifndef SD_CONFIG_INT_H
#define SD_CONFIG_INT_H

#include <stddef.h>

/* What SIGHUP needs to rebuild the settings: the command line's values and
 * where the file was. A key is held by its index in sd_config_keys, so this
 * header needs nothing of config.h: config.c includes it and still sits
 * below the two files that check and apply. */
typedef struct {
  size_t key;
  char *value;
} sd_config_cli;

struct sd_config_src {
  int explicit_config;     /* --config given: the file must exist */
  sd_config_cli *cli;
  size_t ncli;
  unsigned *file_line;     /* per key: the file line that set it, 0 when none */
};

/* Digits only: no sign, no blanks, no overflow (config.c). */
int sd_config_digits(const char *s, int base, unsigned long long *out, const char **end);

#endif
