/* Leveled logging to stderr: one line per record, prefixed with a local timestamp and the level. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "log.h"

static sd_log_level current = SD_LOG_INFO;
static const char *const names[] = {"error", "warn", "info", "debug"};

void sd_log_set_level(sd_log_level level) { current = level; }
sd_log_level sd_log_get_level(void) { return current; }

int sd_log_parse_level(const char *s, sd_log_level *out) {
  for (int i = 0; i <= SD_LOG_DEBUG; i++) {
    if (strcmp(s, names[i]) == 0) {
      *out = (sd_log_level)i;
      return 0;
    }
  }
  if (strcmp(s, "warning") == 0) {
    *out = SD_LOG_WARN;
    return 0;
  }
  return -1;
}

void sd_log(sd_log_level level, const char *fmt, ...) {
  if (level > current) return;
  struct timeval tv;
  struct tm tm;
  char stamp[32];
  gettimeofday(&tv, NULL);
  localtime_r(&tv.tv_sec, &tm);
  strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
  /* Build the whole line first so concurrent writers never interleave
   * halves of records. */
  char line[2048];
  int n = snprintf(line, sizeof line, "%s.%03d shardd %s: ", stamp, (int)(tv.tv_usec / 1000),
                   names[level]);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof line) n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  fwrite(line, 1, (size_t)n, stderr);
  fflush(stderr);
}
