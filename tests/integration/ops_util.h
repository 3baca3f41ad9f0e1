/* Helpers for the operations tests on the shared fixture (fixture.c): daemons with any flags and environment, captured programs, logs polled. */
#ifndef SD_IT_OPS_UTIL_H
#define SD_IT_OPS_UTIL_H

#include <stddef.h>
#include <sys/types.h>

#include "harness.h"

/* Criterion .init: a scratch folder in H (root, sock, log, outside) and no
 * daemon yet; pair with h_teardown, which stops H.pid if set. */
void o_scratch(void);

/* "DIR/name" under the scratch folder. */
const char *o_path(char *buf, size_t n, const char *name);
void o_write(const char *path, const char *text);

/* Runs prog with args (NULL-terminated) and extra environment entries
 * "K=V" in env (NULL-terminated, may be NULL); stdout and stderr into out.
 * Returns the wait status. */
int o_run(char *out, size_t n, const char *const *env, const char *prog, ...) __attribute__((sentinel));

/* Starts argv[0] (argv NULL-terminated) with env added, stdin from
 * /dev/null, stdout and stderr appended to H.log, and fd3 (when >= 0)
 * passed as descriptor 3. Sets H.pid. Does not wait for anything. */
pid_t o_spawn(const char *const *argv, const char *const *env, int fd3);
/* Starts $SHARDD with "--root H.root --socket H.sock" and then extra
 * (NULL-terminated, may be NULL), and waits until H.sock accepts. */
void o_start(const char *const *extra, const char *const *env);
/* Waits until path accepts connections (H.pid must stay alive). */
void o_wait_accepts(const char *path);
/* SIGTERM H.pid and asserts a clean exit 0 (socket file not checked). */
void o_stop(void);

/* Waits until H.log holds needle; returns the log (malloc'd). */
char *o_log_wait(const char *needle);
/* Whether H.log holds needle now. */
int o_log_has(const char *needle);
/* 1 when exit status st is a normal exit with code. */
int o_exited(int st, int code);

#endif
