/* A fresh folder per test for the reader tests: made, files put in it by hand, removed. */
#include "fixture_dir.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char tmpdir[64];
char ckdir[128];

void dir_setup(const char *tag, int make_ck) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/shardd-test-%s-XXXXXX", tag);
  cr_assert_not_null(mkdtemp(tmpdir));
  snprintf(ckdir, sizeof ckdir, "%s/ck", tmpdir);
  if (make_ck) cr_assert_eq(mkdir(ckdir, 0755), 0);
}

void dir_teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_assert_eq(system(cmd), 0);
}

void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", ckdir, name); }

void put(const char *name, const void *b, size_t len) {
  char path[256];
  path_of(path, sizeof path, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert_geq(fd, 0, "%s", path);
  cr_assert_eq(write(fd, b, len), (ssize_t)len);
  close(fd);
}

void put_str(const char *name, const char *s) { put(name, s, strlen(s)); }
