/* Raw-protocol clients, daemons with extra flags, tree hashes and /proc probes for the hostile, limits, permission and fault suites. */
#ifndef SD_IT_XCLIENT_H
#define SD_IT_XCLIENT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

/* Generous bound for one reply; only stops a hung test. */
#define X_REPLY_MS 30000

/* Sanitizer builds run the same tests with fewer repetitions (the suite
 * runs on both trees and ASan makes every process several times slower). */
#if defined(__SANITIZE_ADDRESS__)
#define X_SANITIZED 1
#else
#define X_SANITIZED 0
#endif

/* ------------------------------------------------------------------------ *
 * The daemon: H (harness.h) with its paths set up but not started, so each
 * test chooses its flags and environment.
 * ------------------------------------------------------------------------ */
/* Criterion .init: H's scratch folder and paths; no daemon yet. */
void x_init(void);
/* Criterion .fini: stops H if running (asserting a clean exit) and removes the scratch folder. */
void x_fini(void);
/* Starts H with the NULL-terminated extra flags (may be NULL). The
 * environment (SHARDD_TEST_CRASH_AT, ...) is inherited. */
void x_start(const char *const *extra);
/* x_start with the daemon's soft and hard RLIMIT_NOFILE set to nofile in
 * the child before exec (`ulimit -n`); 0 leaves them alone. */
void x_start_nofile(const char *const *extra, unsigned nofile);
/* H was killed (by itself or by us): reaps it, asserts it died of SIGKILL. */
void x_reap_killed(void);
/* Number of times the daemon's log holds `needle`. */
int x_log_count(const char *needle);

/* ------------------------------------------------------------------------ *
 * A raw connection speaking the protocol byte by byte
 * ------------------------------------------------------------------------ */
typedef struct {
  int fd;
  char *buf;
  size_t len, cap;
  int eof;
} x_conn;

/* Connects to H.sock; asserts success. */
x_conn *x_connect(void);
/* Connects; NULL when the daemon does not accept. */
x_conn *x_try_connect(const char *sock);
void x_close(x_conn *c);
/* Sends bytes as they are (no newline added); a peer that hung up is not an error. */
void x_send(x_conn *c, const void *data, size_t len);
/* Sends a formatted line, '\n' appended. */
void x_sendf(x_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Next complete line from the daemon (NUL-terminated, malloc'd, '\n' dropped);
 * NULL on EOF or after timeout_ms. */
char *x_read_line(x_conn *c, int timeout_ms);
/* Next line parsed as JSON (events included); NULL on EOF or timeout. */
json_t *x_read(x_conn *c, int timeout_ms);
/* Next reply, skipping events; asserts one arrives. */
json_t *x_reply(x_conn *c);
/* Sends line (plus '\n') and returns the reply. */
json_t *x_call(x_conn *c, const char *line);
json_t *x_callf(x_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* 1 when the daemon closed the connection within timeout_ms (lines still
 * arriving before the EOF are skipped). */
int x_wait_eof(x_conn *c, int timeout_ms);

/* Asserts r is {"ok":true}; releases r. */
void x_ok(json_t *r, const char *what);
/* Asserts r is an error with this code and a message holding frag (NULL:
 * any); releases r. */
void x_err(json_t *r, const char *code, const char *frag, const char *what);
/* status answers on c, with saves in flight equal to nsaves (-1: any). */
void x_status_ok(x_conn *c, int nsaves);
/* The daemon still serves: a fresh connection gets status and a one-rank
 * save commits (h_expect_serving). */
void x_serving(void);

/* ------------------------------------------------------------------------ *
 * File system and process probes
 * ------------------------------------------------------------------------ */
/* FNV-1a over every path, type and byte under dir, in sorted order, without
 * following symlinks: equal hashes mean byte-identical trees. 0 when dir is absent. */
uint64_t x_tree_hash(const char *dir);
/* Open descriptors of pid (/proc/PID/fd). */
int x_fd_count(pid_t pid);
/* VmRSS of pid in KiB. */
long x_rss_kib(pid_t pid);
/* Creates a POSIX shm segment of size bytes filled by fill(i) = (i * 7 + seed) & 0xff;
 * returns its fd (read-write) and maps it into *map when map is not NULL. */
int x_shm_create(const char *name, size_t size, unsigned seed, uint8_t **map);

/* A client as another user, in a forked process (criterion's asserts cannot
 * run in it): sends each line and reads its reply (skipping events).
 * Returns 0, the 1-based number of the first step whose reply lacked
 * `want`, or 100/101 when it could not become the user or connect. */
typedef struct {
  const char *line;
  const char *want;        /* text the reply must hold, e.g. "\"code\":\"permission_denied\"" */
} x_step;
int x_steps_as(uid_t uid, gid_t gid, const x_step *steps, size_t n);

#endif
