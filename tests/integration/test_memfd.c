/* Arenas passed, not looked up: sealed memfds sent with attach (SCM_RIGHTS), refused descriptors, stray ones, name attach. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "xclient.h"

TestSuite(memfd, .init = x_init, .fini = x_fini, .timeout = 120);

/* Sends line ('\n' appended) in one sendmsg carrying the n descriptors fds. */
static void send_with_fds(x_conn *c, const char *line, const int *fds, int n) {
  size_t cap = strlen(line) + 2;
  char *buf = malloc(cap);
  cr_assert_not_null(buf);
  int len = snprintf(buf, cap, "%s\n", line);
  cr_assert(len > 0 && (size_t)len < cap);
  cr_assert(n <= 128);
  union {
    char b[CMSG_SPACE(128 * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {buf, (size_t)len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n > 0) {
    m.msg_control = ctl.b;
    m.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)n * sizeof(int));
  }
  cr_assert_eq(sendmsg(c->fd, &m, MSG_NOSIGNAL), len, "sendmsg: %s", strerror(errno));
  free(buf);
}

/* A puts line of libshardd's shape with n slices (heap): the daemon scans it without a JSON tree,
 * on the loop, or on a worker past 16 KiB. */
static char *puts_line(int n) {
  size_t cap = 64 + (size_t)n * 80, len = 0;
  char *s = malloc(cap);
  cr_assert_not_null(s);
  len += (size_t)snprintf(s, cap, "{\"op\":\"puts\",\"id\":5,\"save\":\"nosuch\",\"slices\":[");
  for (int k = 0; k < n; k++)
    len += (size_t)snprintf(s + len, cap - len, "%s{\"name\":\"t%05d\",\"dtype\":\"F32\",\"shape\":[4],\"region\":1,"
                            "\"offset\":0}", k ? "," : "", k);
  snprintf(s + len, cap - len, "]}");
  return s;
}

static json_t *call_fd(x_conn *c, const char *line, int fd) {
  send_with_fds(c, line, &fd, fd >= 0 ? 1 : 0);
  return x_reply(c);
}

/* A memfd of size bytes filled with (i * 7 + seed) & 0xff; seals as given
 * (-1: created without MFD_ALLOW_SEALING). */
static int memfd_make(const char *name, size_t size, unsigned seed, int seals) {
  int fd = memfd_create(name, MFD_CLOEXEC | (seals >= 0 ? MFD_ALLOW_SEALING : 0));
  cr_assert(fd >= 0, "memfd_create: %s", strerror(errno));
  cr_assert_eq(ftruncate(fd, (off_t)size), 0);
  if (size == 0) return fd;
  uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert(m != MAP_FAILED);
  for (size_t i = 0; i < size; i++) m[i] = (uint8_t)((i * 7 + seed) & 0xff);
  munmap(m, size);
  if (seals > 0) cr_assert_eq(fcntl(fd, F_ADD_SEALS, seals), 0, "F_ADD_SEALS: %s", strerror(errno));
  return fd;
}

static int64_t region_of(json_t *r, const char *what) {
  cr_assert(json_is_true(json_object_get(r, "ok")), "%s: %s", what, json_dumps(r, JSON_COMPACT));
  int64_t id = json_integer_value(json_object_get(r, "region"));
  json_decref(r);
  return id;
}

/* One rank puts a whole F32 tensor from region rid, seals and waits: the
 * bytes on disk are the pattern. */
static void save_from_region(x_conn *c, int64_t rid, const char *save, size_t size, unsigned seed) {
  x_ok(x_callf(c, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1}", save, save),
       "begin");
  x_ok(x_callf(c, "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"w\",\"dtype\":\"F32\",\"shape\":[%zu],\"region\":%lld,"
                  "\"offset\":0}",
               save, size / 4, (long long)rid),
       "put");
  x_ok(x_callf(c, "{\"op\":\"seal\",\"save\":\"%s\"}", save), "seal");
  x_ok(x_callf(c, "{\"op\":\"wait\",\"save\":\"%s\"}", save), "wait");
  uint8_t *want = malloc(size);
  for (size_t i = 0; i < size; i++) want[i] = (uint8_t)((i * 7 + seed) & 0xff);
  h_check_bytes(save, "w", want, size);
  free(want);
}

/* The status metric of bytes staged from sealed memfds. */
static json_int_t copied_sealed(x_conn *c) {
  json_t *r = x_call(c, "{\"op\":\"status\",\"metrics\":true}");
  json_t *v = json_object_get(json_object_get(r, "metrics"), "bytes_copied_sealed");
  cr_assert(json_is_integer(v), "status has no metrics.bytes_copied_sealed");
  json_int_t n = json_integer_value(v);
  json_decref(r);
  return n;
}

/* A figure of status: metrics.KEY, or totals.KEY when totals. */
static json_int_t status_num(x_conn *c, const char *obj, const char *key) {
  json_t *r = x_call(c, "{\"op\":\"status\",\"metrics\":true}");
  json_t *v = json_object_get(json_object_get(r, obj), key);
  cr_assert(json_is_integer(v), "status has no %s.%s", obj, key);
  json_int_t n = json_integer_value(v);
  json_decref(r);
  return n;
}

/* Polls status until metrics.pinned_bytes reaches want: a pin runs off the
 * loop, after attach has answered. */
static void await_pinned(x_conn *c, json_int_t want) {
  for (int i = 0; i < H_WAIT_MS / 10 && status_num(c, "metrics", "pinned_bytes") != want; i++) usleep(10000);
  cr_assert_eq(status_num(c, "metrics", "pinned_bytes"), want, "the sealed arena was never pinned");
}

/* ------------------------------------------------------------------------ *
 * libshardd's own arenas are sealed memfds: several ranks, bytes on disk
 * ------------------------------------------------------------------------ */
Test(memfd, libshardd_arenas_are_sealed_memfds_end_to_end) {
  unsetenv("SHARDD_ARENA");
  x_start(NULL);
  static const h_put puts[] = {
      {.rank = 0, .name = "a", .dtype = "F32", .ndim = 2, .shape = {64, 33}, .boxed = 1, .start = {0, 0},
       .count = {32, 33}},
      {.rank = 1, .name = "a", .dtype = "F32", .ndim = 2, .shape = {64, 33}, .boxed = 1, .start = {32, 0},
       .count = {32, 33}},
      {.rank = 2, .name = "b", .dtype = "BF16", .ndim = 1, .shape = {5000}, .how = H_COPY},
      {.rank = -1, .name = "c", .dtype = "I64", .ndim = 1, .shape = {7}},
  };
  h_script s = {.opts = {.save = "mem", .dir = "mem", .world_size = 3}, .puts = puts, .nputs = 4, .seed = 5};
  h_run(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  for (int r = 0; r < 3; r++)
    cr_assert(strncmp(s.sh->r[r].shm, "memfd:shardd-", 13) == 0, "rank %d's arena is '%s', not a memfd", r,
              s.sh->r[r].shm);
  /* the daemon's side: each rank's arena came in as a descriptor */
  cr_assert_geq(x_log_count(" attached memfd:shardd-"), 3, "the daemon did not log memfd attaches");
  h_shared_free(s.sh);
  x_serving();
}

/* ------------------------------------------------------------------------ *
 * The protocol: attach {"fd":true} with the descriptor on the same sendmsg
 * ------------------------------------------------------------------------ */
Test(memfd, a_sealed_memfd_is_attached_and_saved) {
  x_start(NULL);
  x_conn *c = x_connect();
  size_t size = 3 * 4096 + 12;
  int fd = memfd_make("raw", size, 9, F_SEAL_SHRINK | F_SEAL_SEAL);
  json_t *r = call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd);
  cr_assert_eq(json_integer_value(json_object_get(r, "size")), (json_int_t)size);
  int64_t rid = region_of(r, "attach fd");
  close(fd); /* the daemon holds its own */
  save_from_region(c, rid, "raw", size, 9);
  /* too small for a zero-copy middle: every byte was staged, by plain memcpy */
  cr_assert_eq(copied_sealed(c), (json_int_t)size, "bytes staged from the sealed memfd without preadv or guard");
  x_close(c);
  x_serving();
}

/* Pinning faults in every page of a segment: for a sparse one the kernel
 * allocates all of it, seconds for a GiB. It runs off the loop, so another
 * client is served meanwhile: its status, answered before the pin is done,
 * says so. The worst `hello` latency is printed. Before, attach pinned on
 * the loop and the other client waited for all of it. */
Test(memfd, pinning_a_sparse_arena_stalls_no_other_client) {
  x_start(NULL);
  x_conn *a = x_connect(), *b = x_connect();
  size_t size = (size_t)1 << 30;
  int fd = memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  cr_assert(fd >= 0 && ftruncate(fd, (off_t)size) == 0);
  cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  json_int_t before = status_num(b, "metrics", "pinned_bytes");
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  send_with_fds(a, "{\"op\":\"attach\",\"fd\":true}", &fd, 1);
  close(fd);
  usleep(50000); /* the attach is read first */
  double worst = 0, took = 0;
  int hellos = 0, served_while_pinning = 0;
  for (;;) {
    clock_gettime(CLOCK_MONOTONIC, &t1);
    x_ok(x_call(b, "{\"op\":\"hello\",\"proto\":1}"), "the other client's hello");
    clock_gettime(CLOCK_MONOTONIC, &t2);
    double dt = (double)(t2.tv_sec - t1.tv_sec) + (double)(t2.tv_nsec - t1.tv_nsec) / 1e9;
    worst = dt > worst ? dt : worst;
    hellos++;
    took = (double)(t2.tv_sec - t0.tv_sec) + (double)(t2.tv_nsec - t0.tv_nsec) / 1e9;
    if (status_num(b, "metrics", "pinned_bytes") == before + (json_int_t)size) break;
    served_while_pinning = 1;
    cr_assert(took < H_WAIT_MS / 1000.0, "the sparse arena was never pinned");
    usleep(2000);
  }
  int64_t rid = region_of(x_reply(a), "attach the sparse memfd");
  printf("memfd: pinning a sparse %zu MiB memfd took %.2f s; the other client's worst hello waited %.3f s (%d "
         "hellos)\n", size >> 20, took, worst, hellos);
  cr_assert(served_while_pinning, "the other client was served only once the pin was done (%.2f s)", took);
  x_ok(x_callf(a, "{\"op\":\"detach\",\"region\":%lld}", (long long)rid), "detach");
  cr_assert_eq(status_num(b, "metrics", "pinned_bytes"), before, "detach unpins");
  x_close(a);
  x_close(b);
  x_serving();
}

/* A sealed arena is pinned with the ring after attach: its zero-copy writes are
 * fixed-buffer writes of the pages the client writes, so a second save after
 * the client rewrote them has the new bytes; detach unpins it. */
Test(memfd, a_sealed_arena_is_pinned_and_saved_twice_with_fixed_buffers) {
  x_start(NULL);
  x_conn *c = x_connect();
  size_t size = (4u << 20) + 4096;
  int fd = memfd_create("pinned", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  cr_assert(fd >= 0 && ftruncate(fd, (off_t)size) == 0);
  uint8_t *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert(m != MAP_FAILED);
  for (size_t i = 0; i < size; i++) m[i] = (uint8_t)((i * 7 + 1) & 0xff);
  cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  int64_t rid = region_of(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "attach fd");
  close(fd);
  await_pinned(c, (json_int_t)size); /* pinned after attach, off the loop */
  json_int_t fixed0 = status_num(c, "metrics", "writes_registered");
  save_from_region(c, rid, "pin1", size, 1);
  json_int_t direct1 = status_num(c, "totals", "bytes_zero_copy"), fixed1 = status_num(c, "metrics", "writes_registered");
  cr_assert_gt(direct1, (json_int_t)(4u << 20) - 8192, "the tensor went zero-copy (%lld bytes)", (long long)direct1);
  cr_assert_gt(fixed1, fixed0, "zero-copy writes of a pinned arena are fixed-buffer writes");
  for (size_t i = 0; i < size; i++) m[i] = (uint8_t)((i * 7 + 2) & 0xff); /* the next step's weights */
  save_from_region(c, rid, "pin2", size, 2);
  cr_assert_gt(status_num(c, "totals", "bytes_zero_copy"), direct1);
  uint8_t *want = malloc(size);
  for (size_t i = 0; i < size; i++) want[i] = (uint8_t)((i * 7 + 1) & 0xff);
  h_check_bytes("pin1", "w", want, size); /* the first checkpoint is untouched */
  free(want);
  x_ok(x_callf(c, "{\"op\":\"detach\",\"region\":%lld}", (long long)rid), "detach");
  cr_assert_eq(status_num(c, "metrics", "pinned_bytes"), 0, "detach unpins");
  munmap(m, size);
  x_close(c);
  x_serving();
}

Test(memfd, a_memfd_without_the_shrink_seal_is_refused_naming_it) {
  x_start(NULL);
  x_conn *c = x_connect();
  int fd = memfd_make("unsealed", 4096, 1, 0);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "invalid_argument", "F_SEAL_SHRINK", "no seals");
  close(fd);
  /* sealed, but against growing only */
  fd = memfd_make("growonly", 4096, 1, F_SEAL_GROW);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "invalid_argument", "memfd:growonly", "grow seal");
  close(fd);
  /* no sealing allowed at all */
  fd = memfd_make("nosealing", 4096, 1, -1);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "invalid_argument", "F_SEAL_SHRINK", "no sealing");
  close(fd);
  /* empty, though sealed */
  fd = memfd_make("empty", 0, 1, 0);
  cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "invalid_argument", "empty", "empty memfd");
  close(fd);
  x_status_ok(c, 0);
  x_close(c);
  x_serving();
}

Test(memfd, a_file_a_pipe_and_a_shm_segment_passed_are_refused) {
  x_start(NULL);
  x_conn *c = x_connect();
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/plain", H.base);
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, "0123456789abcdef", 16), 16);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "invalid_argument", "not a memfd", "regular file");
  close(fd);
  int pp[2];
  cr_assert_eq(pipe2(pp, O_CLOEXEC), 0);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", pp[0]), "invalid_argument", "pipe:", "pipe");
  close(pp[0]);
  close(pp[1]);
  /* a /dev/shm segment is tmpfs too, but cannot carry the shrink seal */
  fd = x_shm_create("/shardd-memfd-test", 4096, 3, NULL);
  x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "invalid_argument", "not a memfd", "shm segment");
  close(fd);
  shm_unlink("/shardd-memfd-test");
  x_status_ok(c, 0);
  x_close(c);
  x_serving();
}

/* A descriptor with any other line, two with one attach, one with an attach
 * that did not ask for it, or an attach that asks and sends none: refused,
 * the daemon holds no descriptor more, and keeps serving this client. */
Test(memfd, stray_descriptors_are_closed_and_refused) {
  x_start(NULL);
  x_conn *c = x_connect();
  x_status_ok(c, 0);
  int before = x_fd_count(H.pid);
  int fd = memfd_make("stray", 4096, 1, F_SEAL_SHRINK);
  int two[2] = {fd, fd};
  /* puts, scanned on the loop and (long) on a worker: the descriptor is seen all the same */
  char *puts_short = puts_line(4), *puts_long = puts_line(400);
  cr_assert_gt(strlen(puts_long), 16u << 10);
  for (int i = 0; i < 50; i++) {
    x_err(call_fd(c, puts_short, fd), "invalid_argument", "takes no descriptor", "short puts + fd");
    x_err(call_fd(c, puts_long, fd), "invalid_argument", "takes no descriptor", "long puts + fd");
    x_err(call_fd(c, "{\"op\":\"status\"}", fd), "invalid_argument", "takes no descriptor", "status + fd");
    x_err(call_fd(c, "{\"op\":\"detach\",\"region\":1}", fd), "invalid_argument", "takes no descriptor",
          "detach + fd");
    x_err(call_fd(c, "not json", fd), "bad_request", NULL, "garbage + fd");
    send_with_fds(c, "{\"op\":\"attach\",\"fd\":true}", two, 2);
    x_err(x_reply(c), "invalid_argument", "more than one descriptor", "two fds");
    x_err(call_fd(c, "{\"op\":\"attach\",\"shm\":\"/x\"}", fd), "invalid_argument", "no \"fd\":true",
          "shm attach + fd");
    x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":true,\"shm\":\"/x\"}", fd), "invalid_argument", "not both",
          "both");
    x_err(x_call(c, "{\"op\":\"attach\",\"fd\":true}"), "invalid_argument", "no descriptor came", "no fd");
    x_err(call_fd(c, "{\"op\":\"attach\",\"fd\":1}", fd), "invalid_argument", "'fd' must be a boolean", "fd:1");
  }
  free(puts_short);
  free(puts_long);
  /* 100 with one line: more than the daemon reads at once (the kernel drops the rest) */
  int many[100];
  for (int i = 0; i < 100; i++) many[i] = fd;
  send_with_fds(c, "{\"op\":\"attach\",\"fd\":true}", many, 100);
  x_err(x_reply(c), "invalid_argument", "more than one descriptor", "100 fds");
  /* a connection that leaves with a descriptor on an unfinished line */
  for (int i = 0; i < 20; i++) {
    x_conn *q = x_connect();
    x_status_ok(q, 0);
    int cut = memfd_make("cut", 4096, 1, F_SEAL_SHRINK);
    static char half[] = "{\"op\":\"att";
    struct iovec iov = {half, strlen(half)};
    union {
      char b[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &cut, sizeof(int));
    cr_assert_eq(sendmsg(q->fd, &m, MSG_NOSIGNAL), (ssize_t)strlen(half));
    close(cut);
    if (i % 2) x_status_ok(c, 0); /* the daemon has read it */
    x_close(q);
  }
  x_status_ok(c, 0);
  /* the daemon closes a connection in a callback: give it a few rounds */
  int now = x_fd_count(H.pid);
  for (int64_t until = f_now_ms() + F_WAIT_MS; now != before && f_now_ms() < until;) {
    usleep(20000);
    x_status_ok(c, 0);
    now = x_fd_count(H.pid);
  }
  cr_assert_eq(now, before, "the daemon kept stray descriptors: %d open, %d before", now, before);
  /* the same client still attaches properly */
  int64_t rid = region_of(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "attach after strays");
  cr_assert_eq(rid, 1);
  close(fd);
  x_close(c);
  x_serving();
}

/* Lines without descriptors sent just before and after one with: each
 * descriptor goes to its own attach, however the kernel groups the reads. */
Test(memfd, descriptors_stay_with_their_lines) {
  x_start(NULL);
  x_conn *c = x_connect();
  enum { N = 40 };
  int fds[N];
  for (int i = 0; i < N; i++) {
    char name[16];
    snprintf(name, sizeof name, "m%d", i);
    fds[i] = memfd_make(name, 4096 * (size_t)(i + 1), (unsigned)i, F_SEAL_SHRINK | F_SEAL_SEAL);
  }
  /* all sent before any reply is read */
  for (int i = 0; i < N; i++) {
    x_sendf(c, "{\"op\":\"status\",\"id\":\"s%d\"}", i);
    char line[64];
    snprintf(line, sizeof line, "{\"op\":\"attach\",\"fd\":true,\"id\":%d}", i);
    send_with_fds(c, line, &fds[i], 1);
  }
  for (int i = 0; i < N; i++) {
    json_t *s = x_reply(c);
    cr_assert(json_is_true(json_object_get(s, "ok")), "status %d failed", i);
    json_decref(s);
    json_t *r = x_reply(c);
    cr_assert_eq(json_integer_value(json_object_get(r, "id")), i);
    cr_assert_eq(json_integer_value(json_object_get(r, "size")), 4096 * (i + 1), "attach %d got another memfd", i);
    cr_assert_eq(region_of(r, "attach"), i + 1);
  }
  for (int i = 0; i < N; i++) close(fds[i]);
  x_close(c);
  x_serving();
}

/* The descriptor comes with the first half of its line, the rest later. */
Test(memfd, a_line_split_after_its_descriptor_keeps_it) {
  x_start(NULL);
  x_conn *c = x_connect();
  int fd = memfd_make("split", 8192, 2, F_SEAL_SHRINK);
  const char *line = "{\"op\":\"attach\",\"fd\":true,\"id\":\"split\"}\n";
  struct iovec iov = {(void *)line, 10};
  union {
    char b[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  cr_assert_eq(sendmsg(c->fd, &m, MSG_NOSIGNAL), 10);
  usleep(100000); /* read on its own, most likely; either way the same line */
  x_send(c, line + 10, strlen(line) - 10);
  json_t *r = x_reply(c);
  cr_assert_eq(json_integer_value(json_object_get(r, "size")), 8192);
  int64_t rid = region_of(r, "split attach");
  close(fd);
  save_from_region(c, rid, "split", 8192, 2);
  x_close(c);
}

/* The client cannot shrink a sealed arena, so the save needs no shrink check. */
Test(memfd, a_sealed_arena_cannot_shrink_under_a_save) {
  x_start(NULL);
  x_conn *c = x_connect();
  size_t size = 1 << 20;
  int fd = memfd_make("keep", size, 4, F_SEAL_SHRINK | F_SEAL_SEAL);
  int64_t rid = region_of(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "attach");
  cr_assert_neq(ftruncate(fd, 4096), 0, "a sealed memfd shrank");
  cr_assert_eq(errno, EPERM);
  save_from_region(c, rid, "keep", size, 4);
  close(fd);
  x_close(c);
}

/* Attach by name stays, with its ownership check. */
Test(memfd, attach_by_name_still_works) {
  x_start(NULL);
  x_conn *c = x_connect();
  size_t size = 8192;
  int fd = x_shm_create("/shardd-memfd-named", size, 6, NULL);
  int64_t rid = region_of(x_call(c, "{\"op\":\"attach\",\"shm\":\"/shardd-memfd-named\"}"), "attach by name");
  close(fd);
  save_from_region(c, rid, "named", size, 6);
  cr_assert_eq(copied_sealed(c), 0, "a named segment keeps its defences (preadv)");
  shm_unlink("/shardd-memfd-named");
  x_close(c);
}

/* ------------------------------------------------------------------------ *
 * No privilege needed: a daemon running as a plain user, with no
 * capability, maps memfds that other users pass it, while a 0600 segment
 * of another user is out of its reach by name.
 * ------------------------------------------------------------------------ */
#define U_DAEMON 4245

static int tail_equals(const char *file, size_t size, unsigned seed) {
  size_t len = 0;
  uint8_t *b = (uint8_t *)h_slurp(file, &len);
  if (!b || len < size) return 0;
  int ok = 1;
  for (size_t i = 0; i < size && ok; i++) ok = b[len - size + i] == (uint8_t)((i * 7 + seed) & 0xff);
  free(b);
  return ok;
}

Test(memfd, an_unprivileged_daemon_takes_memfds_from_any_user) {
  if (geteuid() != 0) cr_skip_test("needs root to run the daemon as another user");
  char dir[] = "/tmp/shardd-memfd-XXXXXX", root[96], sock[96], logp[96];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(root, sizeof root, "%s/root", dir);
  snprintf(sock, sizeof sock, "%s/s.sock", dir);
  snprintf(logp, sizeof logp, "%s/log", dir);
  cr_assert_eq(mkdir(root, 0755), 0);
  cr_assert_eq(chmod(dir, 0755), 0);
  cr_assert_eq(chown(dir, U_DAEMON, U_DAEMON), 0);
  cr_assert_eq(chown(root, U_DAEMON, U_DAEMON), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    int lf = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (lf < 0 || dup2(lf, 1) < 0 || dup2(lf, 2) < 0) _exit(100);
    if (setgroups(0, NULL) != 0 || setgid(U_DAEMON) != 0 || setuid(U_DAEMON) != 0) _exit(101);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* after setuid, which clears it: dies with a failed test */
    execl(getenv("SHARDD"), "shardd", "--root", root, "--socket", sock, "--socket-mode", "0666", (char *)NULL);
    _exit(102);
  }
  h_track_pid(pid);
  x_conn *c = NULL;
  for (int64_t until = f_now_ms() + F_WAIT_MS; !c && f_now_ms() < until;) {
    c = x_try_connect(sock);
    if (!c) usleep(20000);
  }
  cr_assert_not_null(c, "the unprivileged daemon did not start");
  /* it really holds no capability */
  char sp[64];
  snprintf(sp, sizeof sp, "/proc/%d/status", (int)pid);
  char *st = h_slurp(sp, NULL);
  cr_assert_not_null(st);
  cr_assert_not_null(strstr(st, "CapEff:\t0000000000000000"), "the daemon has capabilities:\n%s", st);
  free(st);

  /* root's memfd, then another user's: each attached by descriptor and saved */
  size_t size = 2 * 4096 + 8;
  int fd = memfd_make("root", size, 11, F_SEAL_SHRINK | F_SEAL_SEAL);
  x_ok(x_call(c, "{\"op\":\"hello\",\"proto\":1}"), "hello");
  int64_t rid = region_of(call_fd(c, "{\"op\":\"attach\",\"fd\":true}", fd), "root's memfd");
  close(fd);
  x_ok(x_callf(c, "{\"op\":\"begin\",\"save\":\"u\",\"dir\":\"u\",\"rank\":0,\"world_size\":1}"), "begin");
  x_ok(x_callf(c, "{\"op\":\"put\",\"save\":\"u\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[%zu],\"region\":%lld,"
                  "\"offset\":0}",
               size, (long long)rid),
       "put");
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"u\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"u\"}"), "wait");
  char file[160];
  snprintf(file, sizeof file, "%s/u/model.safetensors", root);
  cr_assert(tail_equals(file, size, 11), "%s does not hold the memfd's bytes", file);

  /* a 0600 segment of root: the daemon cannot open it by name */
  int shm = x_shm_create("/shardd-memfd-private", 4096, 1, NULL);
  x_err(x_call(c, "{\"op\":\"attach\",\"shm\":\"/shardd-memfd-private\"}"), "permission_denied", "cannot open",
        "a segment the daemon's user cannot read");
  close(shm);
  shm_unlink("/shardd-memfd-private");
  x_close(c);

  /* another user (not the daemon's) passes its memfd */
  fflush(NULL);
  pid_t k = fork();
  cr_assert(k >= 0);
  if (k == 0) {
    if (setgroups(0, NULL) != 0 || setgid(4244) != 0 || setuid(4243) != 0) _exit(100);
    x_conn *o = x_try_connect(sock);
    int mfd = memfd_create("other", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (!o || mfd < 0 || ftruncate(mfd, 4096) != 0 || fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) _exit(101);
    send_with_fds(o, "{\"op\":\"attach\",\"fd\":true}", &mfd, 1);
    char *r = x_read_line(o, X_REPLY_MS);
    _exit(r && strstr(r, "\"ok\":true") && strstr(r, "\"size\":4096") ? 0 : 102);
  }
  int ws = h_reap(k);
  cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "another user's memfd was not attached (status %d)", ws);

  kill(pid, SIGTERM);
  ws = h_reap(pid);
  cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the unprivileged daemon did not stop cleanly (%d)", ws);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
