/* Integration harness, its tools and the file system: shardctl, paths under the root, temporary folders left, a daemon still serving, recorded checksums against the bytes on disk. */
#include "harness.h"
#include "sd_checksum.h"

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
  for (struct dirent *de; (de = readdir(d));)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
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

/* CRC-32C of bytes [from, end) of ROOT/rel/name. */
static uint32_t file_crc(const char *rel, const char *name, uint64_t from) {
  char p[PATH_MAX], q[PATH_MAX];
  snprintf(q, sizeof q, "%s/%s", rel, name);
  int fd = open(h_path(p, sizeof p, q), O_RDONLY);
  cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
  static uint8_t buf[1 << 20];
  uint32_t crc = 0;
  for (off_t at = (off_t)from;;) {
    ssize_t n = pread(fd, buf, sizeof buf, at);
    cr_assert_geq(n, 0, "%s: %s", p, strerror(errno));
    if (n == 0) break;
    crc = sd_crc32c(crc, buf, (size_t)n);
    at += n;
  }
  close(fd);
  return crc;
}

size_t h_check_sums(const char *rel, int want) {
  sd_ckpt c;
  h_ckpt_read_headers(rel, &c);
  json_t *idx = NULL, *sums = NULL;
  if (c.index_name) {
    char p[PATH_MAX], q[PATH_MAX];
    snprintf(q, sizeof q, "%s/%s", rel, c.index_name);
    json_error_t je;
    idx = json_load_file(h_path(p, sizeof p, q), 0, &je);
    cr_assert_not_null(idx, "%s: %s", p, je.text);
    sums = json_object_get(json_object_get(idx, "metadata"), SD_CHECKSUM_KEY);
    if (!want) cr_assert_null(sums, "%s records checksums", q);
    else cr_assert(json_is_object(sums), "%s records no checksums (metadata.%s)", q, SD_CHECKSUM_KEY);
  }
  size_t checked = 0;
  for (size_t f = 0; f < c.nfiles; f++) {
    const sd_ckpt_file *cf = &c.files[f];
    const char *rec = NULL;
    if (c.index_name) {
      rec = json_string_value(json_object_get(sums, cf->name));
    } else {
      for (size_t m = 0; m < cf->h.nmeta; m++)
        if (!strcmp(cf->h.meta[m].key, SD_CHECKSUM_KEY)) rec = cf->h.meta[m].value;
      if (!want) cr_assert_null(rec, "%s/%s records a checksum in its __metadata__", rel, cf->name);
    }
    if (!want) continue;
    cr_assert_not_null(rec, "%s/%s: no checksum recorded", rel, cf->name);
    uint32_t v;
    cr_assert_eq(sd_crc32c_parse(rec, &v), 0, "%s/%s: checksum '%s' is not 8 hex digits", rel, cf->name, rec);
    char got[SD_CHECKSUM_HEX + 1];
    sd_crc32c_hex(file_crc(rel, cf->name, cf->h.data_start), got);
    cr_assert_str_eq(rec, got, "%s/%s: recorded %s, its data section's CRC-32C is %s", rel, cf->name, rec, got);
    checked++;
  }
  if (want && c.index_name)
    cr_assert_eq(json_object_size(sums), c.nfiles, "%s records %zu checksums for %zu files", rel,
                 json_object_size(sums), c.nfiles);
  json_decref(idx);
  sd_ckpt_free(&c);
  return checked;
}
