/* Observability through a real daemon: shardctl status (table and JSON), watch, Prometheus metrics, the save summary line. */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "ops_util.h"

TestSuite(observe, .init = h_setup, .fini = h_teardown, .timeout = 100);

static char out[1 << 16];

static json_t *status_json(void) {
  int st = h_shardctl(out, sizeof out, "status", "--json", (char *)NULL);
  cr_assert(o_exited(st, 0), "shardctl status --json failed (0x%x): %s", st, out);
  json_error_t je;
  json_t *v = json_loads(out, 0, &je);
  cr_assert_not_null(v, "status --json is not JSON (%s): %s", je.text, out);
  return v;
}

static json_int_t jint(const json_t *o, const char *path1, const char *path2) {
  const json_t *v = json_object_get(o, path1);
  if (path2) v = json_object_get(v, path2);
  cr_assert(json_is_integer(v), "'%s%s%s' is not an integer", path1, path2 ? "." : "", path2 ? path2 : "");
  return json_integer_value(v);
}

/* A one-rank save of one F32 tensor, slices given by (start, count) pairs
 * on dimension 0 of a [4] tensor; returns the wait's code. */
static int one_rank_save(const char *id, const uint64_t *starts, const uint64_t *counts, int nslices) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  shardd_save_opts o = {.save = id, .dir = id, .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  uint64_t shape[1] = {4};
  const float v[4] = {1, 2, 3, 4};
  for (int i = 0; i < nslices; i++) {
    shardd_tensor_desc d = {.name = "w", .dtype = "F32", .ndim = 1, .shape = shape, .start = &starts[i],
                            .count = &counts[i], .index = -1};
    cr_assert_eq(shardd_put_inline(c, id, &d, v + starts[i], counts[i] * sizeof(float)), 0, "%s",
                 shardd_last_error(c));
  }
  cr_assert_eq(shardd_seal(c, id), 0, "%s", shardd_last_error(c));
  shardd_result r;
  int rc = shardd_wait(c, id, H_WAIT_MS, &r);
  shardd_close(c);
  return rc;
}

/* ------------------------------------------------------------------------ *
 * After a committed save
 * ------------------------------------------------------------------------ */
Test(observe, status_table_json_and_metrics_after_a_commit) {
  h_expect_serving(); /* commits save 'serving-1' */

  int st = h_shardctl(out, sizeof out, "status", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  cr_assert(strstr(out, "no saves in flight\n"), "%s", out);
  cr_assert(strstr(out, "clients: 1, regions: 0\n"), "%s", out);
  cr_assert(strstr(out, "totals: 1 saves committed, 0 failed, "), "%s", out);

  json_t *s = status_json();
  json_int_t bytes = jint(s, "totals", "bytes_written");
  cr_assert_gt(bytes, 12, "a checkpoint of a 12-byte tensor reports %lld bytes", (long long)bytes);
  cr_assert_eq(jint(s, "totals", "saves_committed"), 1);
  const json_t *m = json_object_get(s, "metrics");
  cr_assert(json_is_object(m), "status --json has no metrics object: %s", out);
  cr_assert_eq(jint(m, "saves_committed", NULL), 1);
  cr_assert_eq(jint(m, "saves_failed", NULL), 0);
  cr_assert_eq(jint(m, "bytes_written", NULL), bytes);
  cr_assert_eq(jint(m, "files_written", NULL), 1);
  cr_assert_eq(jint(m, "puts", NULL), 1);
  cr_assert_eq(jint(m, "bytes_put", NULL), 12);
  cr_assert_geq(jint(m, "connections", NULL), 2);
  cr_assert_eq(jint(m, "saves_in_flight", NULL), 0);
  cr_assert_eq(jint(m, "save_duration_seconds", "count"), 1);
  json_decref(s);

  st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  static const char *const want[] = {
      "# HELP shardd_saves_total ",
      "# TYPE shardd_saves_total counter\n",
      "\nshardd_saves_total{result=\"committed\"} 1\n",
      "\nshardd_saves_total{result=\"failed\"} 0\n",
      "# TYPE shardd_save_errors_total counter\n",
      "# TYPE shardd_bytes_written_total counter\n",
      "\nshardd_files_written_total 1\n",
      "\nshardd_puts_total 1\n",
      "\nshardd_put_bytes_total 12\n",
      "# TYPE shardd_saves_in_flight gauge\n",
      "\nshardd_saves_in_flight 0\n",
      "\nshardd_io_queue_depth ",
      "# TYPE shardd_save_duration_seconds histogram\n",
      "\nshardd_save_duration_seconds_bucket{le=\"+Inf\"} 1\n",
      "\nshardd_save_duration_seconds_bucket{le=\"600\"} 1\n",
      "\nshardd_save_duration_seconds_sum ",
      "\nshardd_save_duration_seconds_count 1\n",
      "\nshardd_save_write_seconds_count 1\n",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    cr_assert(strstr(out, want[i]), "metrics lack '%s':\n%s", want[i], out);
  char line[128];
  snprintf(line, sizeof line, "\nshardd_bytes_written_total %lld\n", (long long)bytes);
  cr_assert(strstr(out, line), "metrics lack '%s':\n%s", line + 1, out);
  /* Every sample belongs to a family announced by # TYPE just before. */
  for (char *p = out; *p;) {
    char *nl = strchr(p, '\n');
    cr_assert_not_null(nl, "metrics do not end with a newline");
    cr_assert(*p == '#' || strncmp(p, "shardd_", 7) == 0, "odd line: %.*s", (int)(nl - p), p);
    p = nl + 1;
  }

  /* The summary line of the save. */
  char *log = o_log_wait("committed save 'serving-1'");
  char *l = strstr(log, "committed save 'serving-1'");
  cr_assert(strstr(l, " 1 files, 1 tensors, "), "%.300s", l);
  cr_assert(strstr(l, " GB/s, 0 bytes forwarded"), "%.300s", l);
  free(log);
}

Test(observe, failed_saves_are_counted_by_code) {
  const uint64_t starts[1] = {0}, counts[1] = {2};
  cr_assert_eq(one_rank_save("gappy", starts, counts, 1), SHARDD_E_GAP);
  const uint64_t s2[2] = {0, 2}, c2[2] = {2, 2};
  cr_assert_eq(one_rank_save("whole", s2, c2, 2), 0);
  int st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  cr_assert(strstr(out, "\nshardd_save_errors_total{code=\"gap\"} 1\n"), "%s", out);
  cr_assert(strstr(out, "\nshardd_saves_total{result=\"failed\"} 1\n"), "%s", out);
  cr_assert(strstr(out, "\nshardd_saves_total{result=\"committed\"} 1\n"), "%s", out);
  cr_assert(strstr(out, "\nshardd_puts_total 3\n"), "%s", out);
  st = h_shardctl(out, sizeof out, "status", (char *)NULL);
  cr_assert(strstr(out, "totals: 1 saves committed, 1 failed, "), "%s", out);
}

/* ------------------------------------------------------------------------ *
 * A save in flight
 * ------------------------------------------------------------------------ */
Test(observe, save_in_flight_in_status_watch_and_metrics) {
  shardd_client *c = NULL;
  cr_assert_eq(shardd_connect(H.sock, &c), 0, "%s", shardd_last_error(NULL));
  shardd_save_opts o = {.save = "step-42", .dir = "run/step-42", .rank = 0, .world_size = 2};
  cr_assert_eq(shardd_begin(c, &o), 0, "%s", shardd_last_error(c));
  uint64_t shape[1] = {256}, start[1] = {0}, count[1] = {128};
  float v[128] = {0};
  shardd_tensor_desc d = {.name = "w", .dtype = "F32", .ndim = 1, .shape = shape, .start = start, .count = count,
                          .index = -1};
  cr_assert_eq(shardd_put_inline(c, "step-42", &d, v, sizeof v), 0, "%s", shardd_last_error(c));

  int st = h_shardctl(out, sizeof out, "status", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  cr_assert(strstr(out, "SAVE "), "no table header:\n%s", out);
  cr_assert(strstr(out, "DONE"), "%s", out);
  /* id, state, ranks begun 1/2, sealed 0/2, written 0 B of 512 B put, 0% */
  char *row = strstr(out, "\nstep-42 ");
  cr_assert_not_null(row, "no row for step-42:\n%s", out);
  cr_assert(strstr(row, " open ") && strstr(row, " 1/2 ") && strstr(row, " 0/2 ") && strstr(row, " 0 B ") &&
                strstr(row, " 512 B ") && strstr(row, "0.0%"),
            "row: %.200s", row);
  cr_assert(strstr(out, "clients: 2, regions: 0\n"), "%s", out);

  json_t *s = status_json();
  const json_t *saves = json_object_get(s, "saves");
  cr_assert_eq(json_array_size(saves), 1, "%s", out);
  cr_assert_str_eq(json_string_value(json_object_get(json_array_get(saves, 0), "save")), "step-42");
  cr_assert_eq(jint(json_array_get(saves, 0), "bytes_planned", NULL), 512);
  cr_assert_eq(jint(s, "metrics", "saves_in_flight"), 1);
  json_decref(s);

  st = h_shardctl(out, sizeof out, "watch", "--count", "1", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  cr_assert(strstr(out, "1 save in flight"), "%s", out);
  cr_assert(strstr(out, "step-42  open     [..............................]   0.0%  0 B / 512 B  sealed 0/2"),
            "no progress bar for step-42:\n%s", out);
  cr_assert_null(strstr(out, "\033["), "escape codes although stdout is not a terminal:\n%s", out);
  st = h_shardctl(out, sizeof out, "watch", "--count", "3", "--interval", "0.05", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  int frames = 0;
  for (char *p = out; (p = strstr(p, "shardd on ")); p++) frames++;
  cr_assert_eq(frames, 3, "watch --count 3 drew %d frames:\n%s", frames, out);

  st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(strstr(out, "\nshardd_saves_in_flight 1\n"), "%s", out);
  cr_assert(strstr(out, "\nshardd_save_bytes_planned{save=\"step-42\",state=\"open\"} 512\n"), "%s", out);
  cr_assert(strstr(out, "\nshardd_save_bytes_written{save=\"step-42\",state=\"open\"} 0\n"), "%s", out);

  cr_assert_eq(shardd_abort(c, "step-42"), 0, "%s", shardd_last_error(c));
  shardd_close(c);
  st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(strstr(out, "\nshardd_save_errors_total{code=\"aborted\"} 1\n"), "%s", out);
}

/* Without --count, watch runs until Ctrl-C and then exits cleanly. */
Test(observe, watch_runs_until_interrupted) {
  char path[PATH_MAX];
  o_path(path, sizeof path, "watch.out");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  cr_assert(fd >= 0);
  const char *bin = getenv("SHARDCTL");
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(bin, bin, "--socket", H.sock, "watch", "--interval", "0.05", (char *)NULL);
    _exit(127);
  }
  close(fd);
  /* Two frames drawn: it is looping. */
  for (int i = 0; i < 2000; i++) {
    char *o = h_slurp(path, NULL);
    int frames = 0;
    for (char *p = o; p && (p = strstr(p, "shardd on ")); p++) frames++;
    free(o);
    if (frames >= 2) break;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  cr_assert_eq(kill(pid, SIGINT), 0);
  int st = h_reap(pid);
  char *o = h_slurp(path, NULL);
  cr_assert(o_exited(st, 0), "watch ended with status 0x%x after Ctrl-C:\n%s", st, o);
  cr_assert(strstr(o, "0 saves in flight"), "%s", o);
  free(o);
}

/* ------------------------------------------------------------------------ *
 * Usage and an absent daemon
 * ------------------------------------------------------------------------ */
Test(observe, usage_errors_and_unreachable_daemon) {
  int st = h_shardctl(out, sizeof out, "watch", "--count", "0", (char *)NULL);
  cr_assert(o_exited(st, 2) && strstr(out, "--count needs a positive whole number"), "%s", out);
  st = h_shardctl(out, sizeof out, "metrics", "--json", (char *)NULL);
  cr_assert(o_exited(st, 2) && strstr(out, "--json goes with status"), "%s", out);
  const char *bin = getenv("SHARDCTL");
  char gone[600];
  snprintf(gone, sizeof gone, "%s/nobody-here.sock", H.base);
  st = o_run(out, sizeof out, NULL, bin, "--socket", gone, "metrics", (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, "connect_failed") && strstr(out, "nobody-here.sock"), "%s", out);
}
