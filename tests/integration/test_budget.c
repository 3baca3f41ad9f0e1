/* Resource budgets: a connection flood under 1,024 descriptors, the spare descriptor, inline bytes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "sd_base64.h"
#include "xclient.h"

TestSuite(budget, .init = x_init, .fini = x_fini, .timeout = 180);

#define FD_LIMIT 1024
#define FLOOD 1100

static void nap(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Starts H under a soft and hard descriptor limit of FD_LIMIT, set in the
 * forked child before exec as `ulimit -n 1024` would. */
static void start_capped(const char *const *flags) {
  struct rlimit mine;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &mine), 0);
  if (mine.rlim_cur < FLOOD + 256) cr_skip_test("the test itself needs %d descriptors", FLOOD + 256);
  x_start_nofile(flags, FD_LIMIT);
  char want[64];
  snprintf(want, sizeof want, "descriptor limit: %d", FD_LIMIT);
  cr_assert_eq(x_log_count(want), 1, "the daemon did not log its descriptor limit ('%s')", want);
}

/* FLOOD connections to H.sock that say nothing, held open by the caller. */
static x_conn **flood(void) {
  x_conn **c = calloc(FLOOD, sizeof *c);
  cr_assert_not_null(c);
  for (int i = 0; i < FLOOD; i++) {
    c[i] = x_try_connect(H.sock);
    cr_assert_not_null(c[i], "connection %d of the flood: %s", i, strerror(errno));
  }
  return c;
}

static void flood_end(x_conn **c) {
  for (int i = 0; i < FLOOD; i++) x_close(c[i]);
  free(c);
}

static int status_answered(void) {
  x_conn *c = x_try_connect(H.sock);
  if (!c) return 0;
  x_sendf(c, "{\"op\":\"status\"}");
  json_t *r = x_read(c, X_REPLY_MS);
  int ok = r && json_is_true(json_object_get(r, "ok"));
  json_decref(r);
  x_close(c);
  return ok;
}

/* ------------------------------------------------------------------------ */
Test(budget, connection_flood_under_1024_descriptors_leaves_the_socket_answering) {
  const char *flags[] = {"--max-connections", "100000", NULL}; /* the descriptor budget is what binds */
  start_capped(flags);
  x_conn **c = flood();
  /* the daemon took what its budget allows and refused the rest out loud */
  F_POLL(x_log_count("too many open descriptors") > 0);
  cr_assert(x_log_count("too many open descriptors") >= 1, "no log line for the connections refused");
  /* the last of the flood may still wait in the listen queue: counted as they come */
  int refused = 0;
  char *gone = calloc(FLOOD, 1);
  for (int round = 0; round < 50 && refused < FLOOD - FD_LIMIT; round++)
    for (int i = 0; i < FLOOD; i++)
      if (!gone[i] && x_wait_eof(c[i], 1)) refused += gone[i] = 1;
  free(gone);
  cr_assert_geq(refused, FLOOD - FD_LIMIT, "only %d connections were refused", refused);
  cr_assert_leq(x_fd_count(H.pid), FD_LIMIT, "the daemon holds more descriptors than its limit");
  /* A fresh connection is answered: the oldest silent connection makes room. */
  nap(1200);
  for (int k = 0; k < 3; k++) cr_assert(status_answered(), "status %d on a fresh connection was not answered", k);
  cr_assert_eq(x_log_count("sent no request for"), 1,
               "no silent connection was closed to make room, or its log line is not rate-limited");
  cr_assert_eq(x_log_count("out of descriptors"), 0, "the reserve did not keep the table from filling up");
  cr_log_info("flood: %d of %d refused at once", refused, FLOOD);
  flood_end(c);
  x_serving();
}

Test(budget, without_a_reserve_the_spare_descriptor_keeps_the_listener_alive) {
  const char *flags[] = {"--max-connections", "100000", "--fd-reserve", "0", NULL};
  start_capped(flags);
  x_conn **c = flood();
  /* The table filled up: the connections past it were taken off the queue and closed, and it was said. */
  F_POLL(x_log_count("out of descriptors") > 0);
  cr_assert_eq(x_log_count("out of descriptors"), 1, "the spare-descriptor line is missing or not rate-limited");
  cr_assert(x_log_count("with the spare descriptor") == 1);
  cr_assert_leq(x_fd_count(H.pid), FD_LIMIT);
  flood_end(c);
  /* once the flood is gone everything is normal again */
  int ok = 0;
  for (int64_t until = f_now_ms() + F_WAIT_MS; !ok && f_now_ms() < until;) {
    ok = status_answered();
    if (!ok) nap(10);
  }
  cr_assert(ok, "status not answered after the flood ended");
  x_serving();
}

/* ------------------------------------------------------------------------ */
/* A U8 tensor of n bytes (value i & 0xff), inline. */
static json_t *put_bytes(x_conn *c, const char *save, const char *name, size_t n) {
  uint8_t *raw = malloc(n + 1);
  char *b64 = malloc(sd_b64_encoded_len(n) + 1);
  cr_assert(raw && b64);
  for (size_t i = 0; i < n; i++) raw[i] = (uint8_t)i;
  sd_b64_encode(raw, n, b64);
  json_t *r = x_callf(c,
                      "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"%s\",\"dtype\":\"U8\",\"shape\":[%zu],"
                      "\"data\":\"%s\"}",
                      save, name, n, b64);
  free(raw);
  free(b64);
  return r;
}

static json_t *file_bytes(x_conn *c, const char *save, const char *path, size_t n) {
  char *raw = malloc(n + 1), *b64 = malloc(sd_b64_encoded_len(n) + 1);
  cr_assert(raw && b64);
  memset(raw, 'x', n);
  sd_b64_encode(raw, n, b64);
  json_t *r = x_callf(c, "{\"op\":\"file\",\"save\":\"%s\",\"path\":\"%s\",\"data\":\"%s\"}", save, path, b64);
  free(raw);
  free(b64);
  return r;
}

static void begin1(x_conn *c, const char *save, const char *dir) {
  x_ok(x_callf(c, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1}", save, dir), save);
}

static void commit(x_conn *c, const char *save) {
  x_ok(x_callf(c, "{\"op\":\"seal\",\"save\":\"%s\"}", save), "seal");
  x_ok(x_callf(c, "{\"op\":\"wait\",\"save\":\"%s\"}", save), "wait");
}

Test(budget, inline_bytes_are_capped_per_save_and_daemon_wide_and_released_when_a_save_ends) {
  const char *flags[] = {"--max-inline-bytes-per-save", "1K", "--max-inline-bytes", "2K", NULL};
  x_start(flags);
  x_conn *a = x_connect(), *b = x_connect(), *c = x_connect();
  begin1(a, "a", "inl/a");
  begin1(b, "b", "inl/b");
  begin1(c, "c", "inl/c");
  x_ok(put_bytes(a, "a", "w0", 600), "600 bytes");
  x_err(put_bytes(a, "a", "w1", 600), "limit_exceeded", "max_inline_bytes_per_save=1024", "a put past the save's cap");
  x_err(file_bytes(a, "a", "big.json", 600), "limit_exceeded", "max_inline_bytes_per_save=1024",
        "a file past the save's cap");
  x_err(file_bytes(a, "a", "big.json", 600), "limit_exceeded", "file 'big.json'", "the message names the file");
  x_ok(file_bytes(a, "a", "small.json", 400), "a file that fits"); /* 1000 of 1024 */
  x_ok(put_bytes(b, "b", "w", 1000), "another save's own 1000 bytes");
  /* 2000 held: 100 more would pass c's own cap but not the daemon's */
  x_err(put_bytes(c, "c", "w", 100), "limit_exceeded", "max_inline_bytes=2048", "a put past the daemon's cap");
  x_err(put_bytes(c, "c", "w", 100), "limit_exceeded", "tensor 'w'", "the message names the tensor");
  /* the refusals failed no save: a commits, and its bytes are released */
  commit(a, "a");
  uint8_t want[600];
  for (int i = 0; i < 600; i++) want[i] = (uint8_t)i;
  h_check_bytes("inl/a", "w0", want, sizeof want);
  x_ok(put_bytes(c, "c", "w", 1000), "the bytes a released are free again");
  commit(b, "b");
  commit(c, "c");
  h_verify_ok("inl/b");
  h_verify_ok("inl/c");
  /* an aborted save releases its bytes too */
  begin1(a, "d", "inl/d");
  x_ok(put_bytes(a, "d", "w", 1024), "exactly the save's cap");
  x_ok(x_call(a, "{\"op\":\"abort\",\"save\":\"d\"}"), "abort");
  begin1(b, "e", "inl/e");
  x_ok(put_bytes(b, "e", "w", 1024), "after an abort");
  x_ok(file_bytes(b, "e", "f.json", 0), "an empty file costs nothing");
  commit(b, "e");
  x_close(a);
  x_close(b);
  x_close(c);
  x_serving();
}

Test(budget, inline_limits_default_to_64m_per_save_and_256m_in_all) {
  char out[65536];
  const char *bin = getenv("SHARDD");
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "%s --check-config --root %s/r2 2>&1", bin, H.base);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  pclose(p);
  cr_assert(strstr(out, "max_inline_bytes_per_save = 67108864"), "%s", out);
  cr_assert(strstr(out, "max_inline_bytes = 268435456"), "%s", out);
  cr_assert(strstr(out, "fd_reserve = 64"), "%s", out);
}

/* ------------------------------------------------------------------------ *
 * A save of more files than the daemon may hold descriptors
 *
 * 3,000 tensors of 64 bytes with max_shard_size 64: one file each, under a
 * soft and hard limit of 512 descriptors. The publish used to hold every
 * file open from its creation to its fsync and failed with `Too many open
 * files`; now each is opened when it is written and closed once fsynced.
 * ------------------------------------------------------------------------ */
#define MANY_FILES 3000
#define MANY_LIMIT 512

Test(budget, a_save_of_3000_files_under_512_descriptors_commits) {
  static char names[MANY_FILES][24];
  static h_put puts[MANY_FILES];
  for (int i = 0; i < MANY_FILES; i++) {
    snprintf(names[i], sizeof names[i], "t.%05d", i);
    puts[i] = (h_put){.rank = i % 2, .name = names[i], .dtype = "F32", .ndim = 1, .shape = {16}, .boxed = 1,
                      .start = {0}, .count = {16}, .how = i % 3 == 0 ? H_COPY : 0};
  }
  x_start_nofile(NULL, MANY_LIMIT);
  char want[64];
  snprintf(want, sizeof want, "descriptor limit: %d", MANY_LIMIT);
  cr_assert_eq(x_log_count(want), 1, "the daemon did not log its descriptor limit ('%s')", want);
  h_script s = {.opts = {.save = "many", .dir = "runs/many", .world_size = 2, .max_shard_size = 64},
                .puts = puts, .nputs = MANY_FILES, .seed = 30};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s); /* h_ckpt_read: every file, checksum and index entry, and verify --deep */
  char p[PATH_MAX];
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "runs/many")), MANY_FILES + 1, "3,000 shards and the index");
}

/* ------------------------------------------------------------------------ *
 * max_open_files: a hard cap on the files a save holds open
 *
 * One-tensor files of 128 KiB, placed for zero-copy (up to 16 writes in
 * flight, each to another file), under --max-open-files 8. A thread counts the
 * daemon's descriptors (/proc/PID/fd) while the save runs; the most it sees
 * must stay within the cap plus what the daemon holds besides shard files:
 * the count before the save, the two ranks' connections and segments, the
 * save's folders, the checksums' late file and the O_DIRECT probe.
 * Without the cap the files open at once follow the writes in flight
 * (16 and more here).
 * ------------------------------------------------------------------------ */
#define CAP_FILES (X_SANITIZED ? 150 : 400)
#define CAP_ELEMS 32768 /* F32: 128 KiB a file */
#define CAP_OPEN 8
#define CAP_BESIDES 12

typedef struct {
  pid_t pid;
  volatile int stop;
  int peak, samples;
} fd_watch;

static void *watch_fds(void *arg) {
  fd_watch *w = arg;
  while (!w->stop) {
    int n = x_fd_count(w->pid);
    if (n > w->peak) w->peak = n;
    w->samples++;
    nap(1);
  }
  return NULL;
}

/* The daemon's metric `key` (status). */
static json_int_t metric(const char *key) {
  x_conn *c = x_connect();
  json_t *r = x_call(c, "{\"op\":\"status\",\"metrics\":true}");
  json_t *v = json_object_get(json_object_get(r, "metrics"), key);
  cr_assert(json_is_integer(v), "status has no metric %s", key);
  json_int_t n = json_integer_value(v);
  json_decref(r);
  x_close(c);
  return n;
}

static int save_under_cap(const char *cap, const char *id, int nfiles) {
  static char names[CAP_FILES][24];
  static h_put puts[CAP_FILES];
  for (int i = 0; i < nfiles; i++) {
    snprintf(names[i], sizeof names[i], "t.%05d", i);
    puts[i] = (h_put){.rank = i % 2, .name = names[i], .dtype = "F32", .ndim = 1, .shape = {CAP_ELEMS}};
  }
  const char *flags[] = {"--max-open-files", cap, NULL};
  x_start(flags);
  fd_watch w = {.pid = H.pid};
  int before = x_fd_count(H.pid);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, watch_fds, &w), 0);
  char dir[64];
  snprintf(dir, sizeof dir, "runs/%s", id);
  h_script s = {.opts = {.save = id, .dir = dir, .world_size = 2, .max_shard_size = 64},
                .puts = puts, .nputs = (size_t)nfiles, .seed = 31, .place = 1};
  h_run(&s);
  w.stop = 1;
  pthread_join(t, NULL);
  h_expect_committed(&s);
  h_check_script(&s);
  char p[PATH_MAX];
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, dir)), nfiles + 1, "every shard and the index");
  cr_assert_eq(metric("max_open_files"), atoi(cap));
  json_int_t peak = metric("files_open_peak");
  cr_log_info("--max-open-files %s: %d files, %d descriptors before, at most %d during the save (%d samples); "
              "files_open_peak %lld, files_reopened %lld", cap, nfiles, before, w.peak, w.samples, (long long)peak,
              (long long)metric("files_reopened"));
  cr_assert_gt(w.samples, 1, "the save was over before the descriptors were counted twice");
  cr_assert_leq(peak, atoi(cap), "the writer held %lld files open under a cap of %s", (long long)peak, cap);
  cr_assert_eq(metric("files_open"), 0, "files left open after the save");
  return w.peak - before;
}

Test(budget, max_open_files_bounds_the_descriptors_a_save_holds) {
  int grew = save_under_cap("8", "capped", CAP_FILES);
  cr_assert_leq(grew, CAP_OPEN + CAP_BESIDES, "the daemon's descriptors grew by %d during the save, over the cap of %d "
                "files and %d besides", grew, CAP_OPEN, CAP_BESIDES);
}
