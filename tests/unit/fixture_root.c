/* Shared fixture of the writer tests (test_publish.c, test_staging.c, test_copies.c, test_gather.c): a root in a fresh folder, a loop, a writer, publish outcomes, bytes read back. */
#include "fixture_root.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

fr_root FR = {.root_fd = -1};

void fr_open_root(const char *path) {
  sd_error err;
  if (FR.root_fd >= 0) close(FR.root_fd);
  snprintf(FR.root, sizeof FR.root, "%s", path);
  cr_assert_eq(sd_root_open(FR.root, &FR.root_fd, &err), 0, "%s", err.msg);
}

void fr_open_mounted_root(const char *fstype, const char *opts) {
  snprintf(FR.mnt, sizeof FR.mnt, "%s/%s", FR.base, fstype);
  cr_assert_eq(mkdir(FR.mnt, 0755), 0);
  if (mount(fstype, FR.mnt, fstype, 0, opts) < 0) {
    int e = errno;
    FR.mnt[0] = '\0';
    cr_skip_test("cannot mount a %s (%s): needs root", fstype, strerror(e));
  }
  char r[512];
  snprintf(r, sizeof r, "%s/root", FR.mnt);
  fr_open_root(r);
}

void fr_open_ramfs_root(void) { fr_open_mounted_root("ramfs", NULL); }

void fr_setup(const char *tmpl) {
  snprintf(FR.base, sizeof FR.base, "%s", tmpl);
  cr_assert_not_null(mkdtemp(FR.base));
  snprintf(FR.outside, sizeof FR.outside, "%s/outside", FR.base);
  cr_assert_eq(mkdir(FR.outside, 0755), 0);
  char r[512];
  snprintf(r, sizeof r, "%s/root", FR.base);
  fr_open_root(r);
  cr_assert_eq(uv_loop_init(&FR.loop), 0);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

void fr_closed_cb(void *ud) {
  *(int *)ud = 1;
}

void fr_teardown(void) {
  if (FR.w) {
    int closed = 0;
    sd_writer_close(FR.w, fr_closed_cb, &closed);
    while (!closed && uv_run(&FR.loop, UV_RUN_ONCE)) {}
    cr_expect(closed, "the writer closes");
    FR.w = NULL;
  }
  uv_run(&FR.loop, UV_RUN_DEFAULT);
  cr_expect_eq(uv_loop_close(&FR.loop), 0, "no handle left open");
  if (FR.root_fd >= 0) close(FR.root_fd);
  FR.root_fd = -1;
  if (FR.mnt[0]) umount2(FR.mnt, MNT_DETACH);
  FR.mnt[0] = '\0';
  nftw(FR.base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void fr_on_released(sd_publish *p, void *ud) {
  fr_outcome *o = ud;
  (void)p;
  o->released++;
  if (o->done) o->released_after_done = 1;
}

void fr_on_done(sd_publish *p, void *ud, const sd_error *err, const char *path) {
  fr_outcome *o = ud;
  o->done++;
  o->code = err ? err->code : 0;
  snprintf(o->msg, sizeof o->msg, "%s", err ? err->msg : "");
  snprintf(o->path, sizeof o->path, "%s", path ? path : "");
  o->written = sd_publish_bytes_written(p);
  o->total = sd_publish_bytes_total(p);
  o->zero_copy = sd_publish_bytes_zero_copy(p);
  o->gathered = sd_publish_bytes_gathered(p);
  o->sealed = sd_publish_bytes_sealed(p);
}

void fr_run_until(const fr_outcome *o) {
  while (!o->done && uv_run(&FR.loop, UV_RUN_ONCE)) {}
  cr_assert_eq(o->done, 1, "on_done is called exactly once");
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

void fr_seed(uint64_t seed) { rng_state = seed; }

uint64_t fr_rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

void fr_shuffle_ops(sd_write_op *ops, size_t n) {
  for (size_t i = n; i > 1; i--) {
    size_t j = fr_rnd() % i;
    sd_write_op t = ops[i - 1];
    ops[i - 1] = ops[j];
    ops[j] = t;
  }
}

uint8_t *fr_slurp(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return NULL;
  struct stat st;
  fstat(fd, &st);
  uint8_t *b = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, b + got, (size_t)st.st_size - got);
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  *len = got;
  return b;
}

void fr_expect_file(const char *path, const char *name, const uint8_t *want, uint64_t len) {
  size_t got;
  uint8_t *b = fr_slurp(path, &got);
  cr_assert_not_null(b, "%s is missing", path);
  cr_expect_eq(got, len, "%s: %zu bytes, want %llu (no padding left)", name, got, (unsigned long long)len);
  if (got == len && memcmp(b, want, len)) {
    uint64_t i = 0;
    while (b[i] == want[i]) i++;
    cr_expect_fail("%s: first wrong byte at offset %llu", name, (unsigned long long)i);
  }
  free(b);
}
