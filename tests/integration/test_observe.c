/* Observability through a real daemon: shardctl status (table and JSON), watch, Prometheus metrics (the writer's I/O too, and GET /metrics over HTTP), the save summary line and the O_DIRECT fallback warning. */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/magic.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

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
  /* id, state, ranks begun 1/2, sealed 0/2, written 0 B of 512 B put; no percentage while ranks declare */
  char *row = strstr(out, "\nstep-42 ");
  cr_assert_not_null(row, "no row for step-42:\n%s", out);
  cr_assert(strstr(row, " open ") && strstr(row, " 1/2 ") && strstr(row, " 0/2 ") && strstr(row, " 0 B ") &&
                strstr(row, " 512 B ") && strstr(row, "declaring (0 of 2 ranks)") && !strstr(row, "%"),
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
  cr_assert(strstr(out, "step-42  open     declaring (0 of 2 ranks)  512 B put so far"),
            "no declaring line for step-42:\n%s", out);
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
  /* Every command's own --help: its synopsis and description, not the whole list. */
  const char *cmds[] = {"verify", "inspect", "status", "watch", "metrics", "abort", "rm"};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    char head[64];
    snprintf(head, sizeof head, " %s", cmds[i]);
    st = h_shardctl(out, sizeof out, cmds[i], "--help", (char *)NULL);
    cr_assert(o_exited(st, 0) && !strncmp(out, "usage: shardctl", 15) && strstr(out, head) &&
                  !strstr(out, "Daemon commands:") && strlen(out) > 60,
              "shardctl %s --help:\n%s", cmds[i], out);
  }
  st = h_shardctl(out, sizeof out, "frob", "--help", (char *)NULL);
  cr_assert(o_exited(st, 2) && strstr(out, "unknown command 'frob'"), "%s", out);
}

/* ------------------------------------------------------------------------ *
 * The writer's figures: O_DIRECT vs buffered writes and bytes, staging memory
 * ------------------------------------------------------------------------ */
/* Whether files in dir take O_DIRECT, the way the daemon asks for it (tmpfs
 * does since Linux 6.6, ramfs never does). */
static int takes_odirect(const char *dir) {
  char p[PATH_MAX + 32];
  snprintf(p, sizeof p, "%s/.odirect-probe", dir);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  cr_assert(fd >= 0, "open %s: %s", p, strerror(errno));
  int fl = fcntl(fd, F_GETFL);
  int ok = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
  close(fd);
  unlink(p);
  return ok;
}

static const char *fs_name(const char *dir) {
  struct statfs sf;
  cr_assert_eq(statfs(dir, &sf), 0, "statfs %s: %s", dir, strerror(errno));
  switch ((unsigned long)sf.f_type) {
  case TMPFS_MAGIC: return "tmpfs";
  case RAMFS_MAGIC: return "ramfs";
  case EXT4_SUPER_MAGIC: return "ext2/3/4";
  case XFS_SUPER_MAGIC: return "xfs";
  case BTRFS_SUPER_MAGIC: return "btrfs";
  case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
  default: return "another file system";
  }
}

/* n tensors "t.K", F32 [elems], each put whole by rank 0 from its arena. */
static void big_script(h_script *s, h_put *puts, char (*names)[16], int n, uint64_t elems, const char *id,
                       uint64_t max_shard) {
  for (int k = 0; k < n; k++) {
    snprintf(names[k], sizeof names[k], "t.%d", k);
    puts[k] = (h_put){.rank = 0, .name = names[k], .dtype = "F32", .ndim = 1, .shape = {elems}};
  }
  *s = (h_script){.opts = {.save = id, .dir = id, .world_size = 1, .max_shard_size = max_shard},
                  .puts = puts, .nputs = (size_t)n, .seed = 7};
}

/* Prometheus sample `name` (labels included) from shardctl metrics text. */
static double prom_sample(const char *text, const char *name) {
  char key[160];
  snprintf(key, sizeof key, "\n%s ", name);
  const char *p = strstr(text, key);
  cr_assert_not_null(p, "metrics lack a sample %s:\n%s", name, text);
  return strtod(p + strlen(key), NULL);
}

/* After saves of data_bytes bytes of tensor data in all, written with O_DIRECT or
 * buffered: the JSON metrics and the Prometheus text agree and add up. */
static void expect_writer_metrics(int odirect, uint64_t data_bytes, uint64_t staging_max) {
  json_t *s = status_json();
  const json_t *m = json_object_get(s, "metrics");
  cr_assert(json_is_object(m), "%s", out);
  json_int_t wd = jint(m, "writes_odirect", NULL), wb = jint(m, "writes_buffered", NULL);
  json_int_t bd = jint(m, "write_bytes_odirect", NULL), bb = jint(m, "write_bytes_buffered", NULL);
  json_int_t wr = jint(m, "writes_registered", NULL), reg = jint(m, "staging_registered", NULL);
  json_int_t wz = jint(m, "writes_zero_copy", NULL); /* from the clients' segments, not staging */
  json_int_t sb = jint(m, "staging_bytes", NULL), peak = jint(m, "staging_peak_bytes", NULL);
  json_int_t max = jint(m, "staging_max_bytes", NULL), written = jint(m, "bytes_written", NULL);
  const char *fs = fs_name(H.root);

  cr_assert_geq(written, (json_int_t)data_bytes, "committed %lld bytes of %llu of data", (long long)written,
                (unsigned long long)data_bytes);
  /* Every byte of every file goes through the writer; O_DIRECT ones round up the last block. */
  cr_assert_geq(bd + bb, written, "the writer wrote %lld + %lld bytes of %lld committed", (long long)bd,
                (long long)bb, (long long)written);
  if (odirect) {
    cr_assert_gt(wd, 0, "%s takes O_DIRECT, yet no O_DIRECT write", fs);
    cr_assert_eq(wb, 0, "%s takes O_DIRECT, yet %lld buffered writes", fs, (long long)wb);
    cr_assert_eq(bb, 0, "%s: %lld bytes buffered", fs, (long long)bb);
    cr_assert_eq(bd % 4096, 0, "O_DIRECT writes are whole blocks: %lld bytes", (long long)bd);
  } else {
    cr_assert_eq(wd, 0, "%s refuses O_DIRECT, yet %lld O_DIRECT writes", fs, (long long)wd);
    cr_assert_gt(wb, 0, "%s: no buffered write", fs);
    cr_assert_eq(bd, 0, "%s: %lld bytes with O_DIRECT", fs, (long long)bd);
    cr_assert_eq(bb, written, "buffered writes carry no padding: %lld bytes for %lld", (long long)bb,
                 (long long)written);
  }
  cr_assert(reg == 0 || reg == 1, "staging_registered %lld", (long long)reg);
  cr_assert_leq(wz, wd + wb, "%lld zero-copy writes of %lld", (long long)wz, (long long)(wd + wb));
  if (reg) cr_assert_geq(wr, wd + wb - wz, "registered buffers, yet %lld of %lld staged writes from them", (long long)wr,
                         (long long)(wd + wb - wz));
  cr_assert_leq(wr, wd + wb + 64, "%lld registered-buffer writes", (long long)wr);
  cr_assert_gt(peak, 0, "staging was used");
  cr_assert_leq(peak, max, "staging peaked at %lld of at most %lld", (long long)peak, (long long)max);
  cr_assert_leq(sb, peak, "%lld staging bytes now, above the peak %lld", (long long)sb, (long long)peak);
  if (staging_max) cr_assert_eq(max, (json_int_t)staging_max, "staging bound %lld", (long long)max);
  json_decref(s);

  int st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  static const char *const want[] = {
      "# TYPE shardd_data_writes_total counter\n", "# TYPE shardd_data_write_bytes_total counter\n",
      "# TYPE shardd_registered_buffer_writes_total counter\n", "# TYPE shardd_staging_bytes gauge\n",
      "# TYPE shardd_staging_peak_bytes gauge\n",       "# TYPE shardd_staging_max_bytes gauge\n",
      "# TYPE shardd_staging_registered gauge\n",
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    cr_assert(strstr(out, want[i]), "metrics lack '%s':\n%s", want[i], out);
  /* Counters and the high-water mark do not move without saves; staging_bytes may (trimmed when idle). */
  cr_assert_eq(prom_sample(out, "shardd_data_writes_total{mode=\"odirect\"}"), (double)wd, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_data_writes_total{mode=\"buffered\"}"), (double)wb, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_data_write_bytes_total{mode=\"odirect\"}"), (double)bd, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_data_write_bytes_total{mode=\"buffered\"}"), (double)bb, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_registered_buffer_writes_total"), (double)wr, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_staging_peak_bytes"), (double)peak, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_staging_max_bytes"), (double)max, "%s", out);
  cr_assert_eq(prom_sample(out, "shardd_staging_registered"), (double)reg, "%s", out);
  cr_assert_leq(prom_sample(out, "shardd_staging_bytes"), (double)peak, "%s", out);
}

/* Occurrences of needle in the daemon's log. */
static int log_count(const char *needle) {
  char *log = h_slurp(H.log, NULL);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
  free(log);
  return n;
}

/* The scratch root (under /tmp, whatever file system that is here). */
Test(observe, writer_metrics_after_a_save) {
  static h_put puts[3];
  static char names[3][16];
  h_script sc;
  big_script(&sc, puts, names, 3, 100000 + 3, "wm", 600000); /* 3 x 400012 bytes: three shards */
  h_run(&sc);
  h_expect_committed(&sc);
  h_check_script(&sc);
  int odirect = takes_odirect(H.root);
  expect_writer_metrics(odirect, 3 * 400012, 0);
  if (odirect) {
    cr_assert_eq(log_count("writing buffered: "), 0, "%s takes O_DIRECT, yet the log warns", fs_name(H.root));
  } else {
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want, "warn: save 'wm': writing buffered: %s/wm refuses O_DIRECT (", H.root);
    free(o_log_wait(want));
  }
}

/* ------------------------------------------------------------------------ *
 * A root that refuses O_DIRECT: a ramfs mounted in a mount namespace of the
 * test's own (gone with the test process, whatever happens), so it needs
 * root; skipped otherwise.
 * ------------------------------------------------------------------------ */
static char no_ramfs[256];
static int ramfs_mounted;

static void ramfs_setup(void) {
  o_scratch();
  no_ramfs[0] = '\0';
  ramfs_mounted = 0;
  cr_assert_eq(mkdir(H.root, 0755), 0, "mkdir %s: %s", H.root, strerror(errno));
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      mount("ramfs", H.root, "ramfs", 0, "mode=0755") != 0) {
    snprintf(no_ramfs, sizeof no_ramfs, "cannot mount a ramfs (%s): needs root", strerror(errno));
    return;
  }
  ramfs_mounted = 1;
}

static void ramfs_teardown(void) {
  h_daemon_stop(&H);
  /* Before the scratch folder goes: the mount point must be empty to go with it. */
  if (ramfs_mounted) umount2(H.root, MNT_DETACH);
  ramfs_mounted = 0;
  h_teardown();
}

TestSuite(observe_fallback, .init = ramfs_setup, .fini = ramfs_teardown, .timeout = 100);

Test(observe_fallback, ramfs_root_is_written_buffered_and_says_so_once_per_save) {
  if (no_ramfs[0]) cr_skip_test("%s", no_ramfs);
  cr_assert_str_eq(fs_name(H.root), "ramfs");
  cr_assert(!takes_odirect(H.root), "ramfs takes O_DIRECT on this kernel?");
  /* --log-syslog-prefix yes: the warning goes through the daemon's logger, with its priority. */
  const char *const extra[] = {"--staging-mib", "8", "--log-syslog-prefix=yes", NULL};
  o_start(extra, NULL);

  /* 3 tensors of 3 MiB, one per file, through 8 MiB of staging. */
  static h_put puts[3];
  static char names[3][16];
  h_script sc;
  big_script(&sc, puts, names, 3, 3 << 18, "fb-1", 4 << 20);
  h_run(&sc);
  h_expect_committed(&sc);
  h_check_script(&sc);
  cr_assert_eq(sc.sh->r[0].res.files, 4, "three shards and the index");
  expect_writer_metrics(0, 3 * (3u << 20), 8u << 20);

  char want[PATH_MAX + 128];
  snprintf(want, sizeof want, "<4>warn: save 'fb-1': writing buffered: %s/fb-1 refuses O_DIRECT (Invalid argument)\n",
           H.root);
  free(o_log_wait(want));
  cr_assert_eq(log_count("writing buffered: "), 1, "one warning for a save of four files");

  h_script sc2;
  static h_put puts2[3];
  static char names2[3][16];
  big_script(&sc2, puts2, names2, 3, 3 << 18, "fb-2", 4 << 20);
  sc2.place = 1; /* zero-copy writes from the segments, through the page cache here */
  h_run(&sc2);
  h_expect_committed(&sc2);
  expect_writer_metrics(0, 6 * (3u << 20), 8u << 20);
  snprintf(want, sizeof want, "<4>warn: save 'fb-2': writing buffered: %s/fb-2 refuses O_DIRECT (Invalid argument)\n",
           H.root);
  free(o_log_wait(want));
  cr_assert_eq(log_count("writing buffered: "), 2, "one warning per save");
  h_check_script(&sc2);
  json_t *st = status_json();
  cr_assert_gt(jint(json_object_get(st, "metrics"), "bytes_zero_copy", NULL), 0, "placed slices went zero-copy");
  json_t *m = json_object_get(st, "metrics"), *tot = json_object_get(st, "totals");
  cr_assert(json_is_integer(json_object_get(m, "bytes_gathered")), "metrics count gathered bytes");
  cr_assert_eq(jint(tot, "bytes_zero_copy", NULL) + jint(tot, "bytes_gathered", NULL) + jint(tot, "bytes_copied", NULL),
               jint(tot, "bytes_written", NULL), "zero-copy, gathered and copied split the bytes written");
  /* The names from before "direct" was split stay, with the same figures, for one release. */
  static const char *const renamed[][3] = {{"totals", "bytes_zero_copy", "bytes_direct"},
                                           {"metrics", "bytes_zero_copy", "bytes_direct"},
                                           {"metrics", "writes_odirect", "writes_direct"},
                                           {"metrics", "write_bytes_odirect", "write_bytes_direct"}};
  for (size_t i = 0; i < sizeof renamed / sizeof renamed[0]; i++) {
    json_t *o = json_object_get(st, renamed[i][0]);
    cr_assert(json_is_integer(json_object_get(o, renamed[i][2])), "%s lacks the old %s", renamed[i][0], renamed[i][2]);
    cr_assert_eq(jint(o, renamed[i][2], NULL), jint(o, renamed[i][1], NULL), "%s: %s", renamed[i][0], renamed[i][2]);
  }
  json_decref(st);
  h_shared_free(sc.sh);
  h_shared_free(sc2.sh);
}

/* ------------------------------------------------------------------------ *
 * GET /metrics over HTTP (metrics_listen), read with a plain socket
 * ------------------------------------------------------------------------ */
TestSuite(metrics_http, .init = o_scratch, .fini = h_teardown, .timeout = 100);

static char http[1 << 17];

/* Sends req to 127.0.0.1:port and reads the whole answer (HTTP/1.0: the
 * server closes) into http; returns the status code. */
static int http_ask(unsigned port, const char *req) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "connect to port %u: %s", port, strerror(errno));
  size_t n = strlen(req);
  cr_assert_eq(write(fd, req, n), (ssize_t)n);
  size_t got = 0;
  for (;;) {
    ssize_t r = read(fd, http + got, sizeof http - 1 - got);
    cr_assert_geq(r, 0, "reading the answer: %s", strerror(errno));
    if (r == 0) break;
    got += (size_t)r;
    cr_assert_lt(got, sizeof http - 1, "answer too long");
  }
  close(fd);
  http[got] = '\0';
  int code = 0;
  cr_assert_eq(sscanf(http, "HTTP/1.%*d %d ", &code), 1, "not an HTTP answer: %.200s", http);
  return code;
}

/* The "# TYPE" lines of Prometheus text, in order (malloc'd). */
static char *type_lines(const char *text) {
  char *out = calloc(1, strlen(text) + 1);
  size_t n = 0;
  cr_assert_not_null(out);
  for (const char *p = strstr(text, "# TYPE "); p; p = strstr(p + 1, "\n# TYPE ")) {
    if (*p == '\n') p++;
    const char *nl = strchr(p, '\n');
    size_t k = nl ? (size_t)(nl - p) + 1 : strlen(p);
    memcpy(out + n, p, k);
    n += k;
  }
  out[n] = '\0';
  return out;
}

static unsigned metrics_port(void) {
  char *log = o_log_wait("metrics: serving http://127.0.0.1:");
  unsigned port = 0;
  const char *at = strstr(log, "metrics: serving http://127.0.0.1:");
  cr_assert_eq(sscanf(at, "metrics: serving http://127.0.0.1:%u/metrics", &port), 1, "%.200s", at);
  free(log);
  cr_assert_gt(port, 0);
  return port;
}

Test(metrics_http, get_metrics_after_a_save_404_405_and_a_clean_stop) {
  /* Set in the config file, quoted (shardd.conf(5)); port 0 picks a free one, logged. */
  char conf[PATH_MAX];
  o_write(o_path(conf, sizeof conf, "shardd.conf"), "metrics_listen = \"127.0.0.1:0\"\n");
  o_start((const char *const[]){"--config", conf, NULL}, NULL);
  unsigned port = metrics_port();

  cr_assert_eq(http_ask(port, "GET /metrics HTTP/1.0\r\n\r\n"), 200, "%.300s", http);
  cr_assert(strstr(http, "\nshardd_saves_total{result=\"committed\"} 0\n"), "%s", http);

  const uint64_t st0[1] = {0}, ct[1] = {4};
  cr_assert_eq(one_rank_save("http-1", st0, ct, 1), 0, "the save failed");

  cr_assert_eq(http_ask(port, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n"), 200, "%.300s", http);
  char *body = strstr(http, "\r\n\r\n");
  cr_assert_not_null(body);
  *body = '\0';
  body += 4;
  cr_assert(strstr(http, "Content-Type: text/plain; version=0.0.4"), "headers: %s", http);
  cr_assert(strstr(body, "\nshardd_up 1\n"), "%s", body);
  char want[256];
  snprintf(want, sizeof want, "\nshardd_build_info{version=\"%s\"} 1\n", SHARDD_VERSION_STRING);
  cr_assert(strstr(body, want), "no '%s' in:\n%s", want + 1, body);
  cr_assert(strstr(body, "\nshardd_saves_total{result=\"committed\"} 1\n"), "%s", body);
  cr_assert(strstr(body, "\nshardd_puts_total 1\n"), "%s", body);
  cr_assert(strstr(body, "\nshardd_save_duration_seconds_count 1\n"), "%s", body);

  /* The same families as shardctl metrics, plus the two a scrape target adds. */
  int st = h_shardctl(out, sizeof out, "metrics", (char *)NULL);
  cr_assert(o_exited(st, 0), "%s", out);
  cr_assert(strstr(out, "\nshardd_saves_total{result=\"committed\"} 1\n"), "%s", out);
  char *a = type_lines(body), *b = type_lines(out);
  const char *extra = "# TYPE shardd_up gauge\n# TYPE shardd_build_info gauge\n";
  cr_assert(strncmp(a, extra, strlen(extra)) == 0, "HTTP families start:\n%s", a);
  cr_assert_str_eq(a + strlen(extra), b, "HTTP and shardctl families differ:\n%s\nvs\n%s", a, b);
  free(a);
  free(b);

  /* Scrapes in a row each get an answer from the loop. */
  for (int i = 0; i < 20; i++)
    cr_assert_eq(http_ask(port, "GET /metrics HTTP/1.0\r\n\r\n"), 200, "scrape %d: %.300s", i, http);

  cr_assert_eq(http_ask(port, "GET / HTTP/1.0\r\n\r\n"), 404, "%.300s", http);
  cr_assert_eq(http_ask(port, "GET /metrics/x HTTP/1.0\r\n\r\n"), 404, "%.300s", http);
  cr_assert_eq(http_ask(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n"), 405, "%.300s", http);
  cr_assert(strstr(http, "Allow: GET, HEAD\r\n"), "%.300s", http);
  cr_assert_eq(http_ask(port, "DELETE /metrics HTTP/1.0\r\n\r\n"), 405, "%.300s", http);
  cr_assert_eq(http_ask(port, "HEAD /metrics HTTP/1.0\r\n\r\n"), 200, "%.300s", http);
  cr_assert_null(strstr(http, "shardd_up"), "HEAD answered with a body: %.300s", http);

  /* SIGTERM: a clean exit 0, and the port is closed. */
  o_stop();
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_neq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "the metrics port still accepts after exit");
  close(fd);
}

Test(metrics_http, off_by_default_and_a_bind_failure_names_the_address) {
  o_start(NULL, NULL);
  h_expect_serving();
  cr_assert(!o_log_has("metrics: serving"), "metrics served without metrics_listen");
  o_stop();

  /* A port already taken: the daemon refuses to start, naming the address. */
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(fd, 1), 0);
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
  const char *bin = getenv("SHARDD");
  int st = o_run(out, sizeof out, NULL, bin, "--root", H.root, "--socket", H.sock, "--metrics-listen", addr,
                 (char *)NULL);
  close(fd);
  cr_assert(o_exited(st, 1), "started on a taken port (0x%x):\n%s", st, out);
  char want[PATH_MAX + 128];
  snprintf(want, sizeof want, "cannot serve metrics on %s: Address already in use", addr);
  cr_assert(strstr(out, want), "error does not say '%s':\n%s", want, out);
  cr_assert(!h_exists(H.sock), "the client socket outlived a failed start");

  st = o_run(out, sizeof out, NULL, bin, "--root", H.root, "--socket", H.sock, "--metrics-listen", "9477",
             (char *)NULL);
  cr_assert(o_exited(st, 1) && strstr(out, "option --metrics-listen: must be HOST:PORT or [IPV6]:PORT"), "%s", out);
  /* --check-config catches a malformed address in the file too (binding is only tried at start). */
  char conf[PATH_MAX];
  o_write(o_path(conf, sizeof conf, "bad.conf"), "metrics_listen = \"localhost\"\n");
  st = o_run(out, sizeof out, NULL, bin, "--check-config", "--config", conf, (char *)NULL);
  snprintf(want, sizeof want, "%s:1: key 'metrics_listen': must be HOST:PORT", conf);
  cr_assert(o_exited(st, 1) && strstr(out, want), "no '%s' in:\n%s", want, out);
}
