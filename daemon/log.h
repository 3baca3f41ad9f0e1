/* Leveled logging to stderr for the daemon. */
#ifndef SD_LOG_H
#define SD_LOG_H

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

#define sd_log_error(...) sd_log(SD_LOG_ERROR, __VA_ARGS__)
#define sd_log_warn(...) sd_log(SD_LOG_WARN, __VA_ARGS__)
#define sd_log_info(...) sd_log(SD_LOG_INFO, __VA_ARGS__)
#define sd_log_debug(...) sd_log(SD_LOG_DEBUG, __VA_ARGS__)

#endif
