/* Integration harness, its tools and the file system: shardctl, paths under the root, temporary folders left, a daemon still serving, recorded checksums against the bytes on disk. */
#include "harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *env_path(const char *var) {
  const char *v = getenv(var);
  cr_assert(v && *v, "environment variable %s is not set (meson test sets it)", var);
  return v;
}

const char *h_path(char *buf, size_t n, const char *rel) {
  snprintf(buf, n, "%s/%s", H.root, rel);
  return buf;
}

int h_exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

/* ------------------------------------------------------------------------ *
 * Tools and the file system
 * ------------------------------------------------------------------------ */
int h_shardctl(char *out, size_t n, ...) {
  const char *head[] = {env_path("SHARDCTL"), "--socket", H.sock, NULL};
  va_list ap;
  va_start(ap, n);
  int st = f_run_va(out, n, NULL, head, ap);
  va_end(ap);
  return st;
}

void h_verify_ok(const char *rel) {
  char dir[PATH_MAX], out[8192];
  h_path(dir, sizeof dir, rel);
  int st = h_shardctl(out, sizeof out, "verify", dir, (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shardctl verify %s refuses it: %s", dir, out);
  cr_assert(strstr(out, "tensor"), "shardctl verify printed no summary: %s", out);
}

int h_dir_count(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  int n = 0;
  DIR *d = fdopendir(fd);
  /* The root's lock file is the daemon's, there while it runs (rootlock.h). */
  for (struct dirent *de; (de = readdir(d));)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, ".shardd-lock")) n++;
  closedir(d);
  return n;
}

static int tmp_found;
static int count_tmp(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  if (strncmp(p + ftw->base, ".shardd-tmp", 11) == 0) tmp_found++;
  return 0;
}

int h_tmp_count(void) {
  tmp_found = 0;
  nftw(H.root, count_tmp, 16, FTW_PHYS);
  return tmp_found;
}

void h_await_no_tmp(void) { F_POLL(h_tmp_count() == 0); }

void h_expect_unpublished(const char *rel) {
  char p[PATH_MAX];
  cr_assert(!h_exists(h_path(p, sizeof p, rel)), "%s exists after a failed save", p);
  cr_assert_eq(h_tmp_count(), 0, "a temporary folder is left under %s", H.root);
  cr_assert_eq(h_dir_count(H.outside), 0, "something was created in %s", H.outside);
}

void h_expect_serving(void) {
  static int n;
  shardd_client *c = NULL;
  int rc = shardd_connect(H.sock, &c);
  cr_assert_eq(rc, 0, "daemon no longer accepts: %s", shardd_last_error(NULL));
  char *js = NULL;
  rc = shardd_status(c, &js);
  cr_assert_eq(rc, 0, "status fails: %s", shardd_last_error(c));
  json_error_t je;
  json_t *st = json_loads(js, 0, &je);
  cr_assert_not_null(st, "status is not JSON: %s", js);
  cr_assert(json_is_array(json_object_get(st, "saves")), "status has no saves list: %s", js);
  cr_assert_eq(json_array_size(json_object_get(st, "saves")), 0, "saves still in flight: %s", js);
  json_decref(st);
  shardd_free(js);

  char save[64], dir[64];
  snprintf(save, sizeof save, "serving-%d", ++n);
  snprintf(dir, sizeof dir, "serving/check-%d", n);
  shardd_save_opts o = {.save = save, .dir = dir, .rank = 0, .world_size = 1};
  cr_assert_eq(shardd_begin(c, &o), 0, "begin after a failure: %s", shardd_last_error(c));
  const float v[3] = {1.5f, -2.0f, (float)n};
  uint64_t shape[1] = {3};
  shardd_tensor_desc d = {.name = "health.w", .dtype = "F32", .ndim = 1, .shape = shape, .index = -1};
  cr_assert_eq(shardd_put_inline(c, save, &d, v, sizeof v), 0, "%s", shardd_last_error(c));
  cr_assert_eq(shardd_seal(c, save), 0, "%s", shardd_last_error(c));
  shardd_result res;
  cr_assert_eq(shardd_wait(c, save, H_WAIT_MS, &res), 0, "a normal save after a failure does not commit: %s",
               shardd_last_error(c));
  shardd_close(c);
  h_check_bytes(dir, "health.w", v, sizeof v);
  h_verify_ok(dir);
}

size_t h_check_sums(const char *rel, int want) {
  char p[PATH_MAX];
  sd_ckpt c;
  h_ckpt_read_headers(rel, &c);
  size_t checked = 0;
  if (want) {
    checked = h_ckpt_deep(h_path(p, sizeof p, rel), &c); /* every file has one, equal to its bytes' */
    cr_assert_eq(checked, c.nfiles, "%s: %zu of %zu files record a checksum", rel, checked, c.nfiles);
  } else {
    for (size_t f = 0; f < c.nfiles; f++)
      cr_assert(!c.files[f].has_crc, "%s/%s records a checksum", rel, c.files[f].name);
  }
  sd_ckpt_free(&c);
  return checked;
}
