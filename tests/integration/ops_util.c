/* Helpers for the operations tests on the shared fixture (fixture.c): daemons with any flags and environment, captured programs, logs polled. */
#include "ops_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

void o_scratch(void) { f_scratch(&H, "ops"); }

const char *o_path(char *buf, size_t n, const char *name) {
  snprintf(buf, n, "%s/%s", H.base, name);
  return buf;
}

void o_write(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "fopen %s: %s", path, strerror(errno));
  fputs(text, f);
  cr_assert_eq(fclose(f), 0);
}

int o_exited(int st, int code) { return WIFEXITED(st) && WEXITSTATUS(st) == code; }

int o_run(char *out, size_t n, const char *const *env, const char *prog, ...) {
  const char *head[] = {prog, NULL};
  va_list ap;
  va_start(ap, prog);
  int st = f_run_va(out, n, env, head, ap);
  va_end(ap);
  return st;
}

pid_t o_spawn(const char *const *argv, const char *const *env, int fd3) {
  f_opts o = {.env = env};
  return f_spawn(&H, argv, &o, fd3);
}

void o_wait_accepts(const char *path) { f_wait_accepts(&H, path); }

void o_start(const char *const *extra, const char *const *env) {
  f_opts o = {.extra = extra, .env = env, .default_log_level = 1};
  f_start(&H, &o);
}

void o_stop(void) {
  cr_assert(H.pid > 0, "no daemon to stop");
  f_stop(&H, 0);
}

int o_log_has(const char *needle) { return f_log_count(H.log, needle) > 0; }

char *o_log_wait(const char *needle) { return f_log_wait(&H, needle); }
