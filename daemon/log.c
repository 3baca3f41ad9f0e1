/* Leveled logging to stderr: one line per record, prefixed with a timestamp (or a syslog priority) and the level. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "sd_escape.h"

static sd_log_level current = SD_LOG_INFO;
static int syslog_prefix;
static const char *const names[] = {"error", "warn", "info", "debug"};
/* syslog(3) priorities: LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG. */
static const int priorities[] = {3, 4, 6, 7};

void sd_log_set_level(sd_log_level level) { current = level; }
sd_log_level sd_log_get_level(void) { return current; }
void sd_log_set_syslog_prefix(int on) { syslog_prefix = on != 0; }
int sd_log_get_syslog_prefix(void) { return syslog_prefix; }

int sd_log_stderr_is_journal(void) {
  const char *v = getenv("JOURNAL_STREAM");
  unsigned long long dev = 0, ino = 0;
  struct stat st;
  if (!v || sscanf(v, "%llu:%llu", &dev, &ino) != 2) return 0;
  if (fstat(STDERR_FILENO, &st) != 0) return 0;
  return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

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
  /* Build the whole line first so concurrent writers never interleave
   * halves of records. */
  char line[2048];
  int n;
  if (syslog_prefix) {
    n = snprintf(line, sizeof line, "<%d>%s: ", priorities[level], names[level]);
  } else {
    struct timeval tv;
    struct tm tm;
    char stamp[32];
    gettimeofday(&tv, NULL);
    localtime_r(&tv.tv_sec, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    n = snprintf(line, sizeof line, "%s.%03d shardd %s: ", stamp, (int)(tv.tv_usec / 1000), names[level]);
  }
  if (n < 0 || (size_t)n >= sizeof line) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (m < 0) return;
  size_t mlen = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
  /* One record, one printable line: a newline from a client or peer must not forge a second
   * record (with its own priority) in the journal, nor an escape sequence drive the terminal. */
  n += (int)sd_escape(msg, mlen, mlen, line + n, sizeof line - (size_t)n - 1);
  line[n++] = '\n';
  fwrite(line, 1, (size_t)n, stderr);
  fflush(stderr);
}

int sd_log_limit_ok(sd_log_limit *l, uint64_t now_ms, unsigned *suppressed) {
  if (l->last_ms && now_ms < l->last_ms + 1000) {
    l->suppressed++;
    return 0;
  }
  l->last_ms = now_ms ? now_ms : 1;
  *suppressed = l->suppressed;
  l->suppressed = 0;
  return 1;
}
