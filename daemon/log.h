/* Leveled logging to stderr for the daemon. */
#ifndef SD_LOG_H
#define SD_LOG_H

#include <stdint.h>

typedef enum { SD_LOG_ERROR, SD_LOG_WARN, SD_LOG_INFO, SD_LOG_DEBUG } sd_log_level;

void sd_log_set_level(sd_log_level level);
/* With prefixes on, each line starts with its syslog priority ("<3>" for
 * error, "<4>" warn, "<6>" info, "<7>" debug) and carries no timestamp:
 * journald reads the priority from the prefix and stamps lines itself. */
void sd_log_set_syslog_prefix(int on);
int sd_log_get_syslog_prefix(void);
/* 1 when stderr is the systemd journal: JOURNAL_STREAM names its device
 * and inode (systemd.exec(5)), so a redirected stderr does not count. */
int sd_log_stderr_is_journal(void);
sd_log_level sd_log_get_level(void);
/* "error", "warn", "info", "debug"; -1 when unknown. */
int sd_log_parse_level(const char *s, sd_log_level *out);
void sd_log(sd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Lines a stranger can cause (refused peer connections, say) at most once a second: */
typedef struct {
  uint64_t last_ms;        /* when a line was last let through; 0: never */
  unsigned suppressed;     /* lines held back since */
} sd_log_limit;
/* 1 when a line may be logged at now_ms; then *suppressed is how many were held back before
 * it (and the count restarts). 0 when it is held back. */
int sd_log_limit_ok(sd_log_limit *l, uint64_t now_ms, unsigned *suppressed);

#define sd_log_error(...) sd_log(SD_LOG_ERROR, __VA_ARGS__)
#define sd_log_warn(...) sd_log(SD_LOG_WARN, __VA_ARGS__)
#define sd_log_info(...) sd_log(SD_LOG_INFO, __VA_ARGS__)
#define sd_log_debug(...) sd_log(SD_LOG_DEBUG, __VA_ARGS__)

#endif
