/* Paths beneath the root: relative-path rules, symlink refusal, parent creation, stale temporary folders. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pathsafe.h"
#include "publish.h"

/* ------------------------------------------------------------------------ *
 * Fixture: a fresh root (and a folder outside it) per test
 * ------------------------------------------------------------------------ */
static char base[64];         /* holds root/ and outside/ */
static char root[128];
static char outside[128];
static int root_fd = -1;

static void setup(void) {
  strcpy(base, "/tmp/sd-pathsafe-XXXXXX");
  cr_assert_not_null(mkdtemp(base));
  snprintf(root, sizeof root, "%s/root", base);
  snprintf(outside, sizeof outside, "%s/outside", base);
  cr_assert_eq(mkdir(outside, 0755), 0);
  sd_error err;
  cr_assert_eq(sd_root_open(root, &root_fd, &err), 0, "%s", err.msg);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void teardown(void) {
  if (root_fd >= 0) close(root_fd);
  root_fd = -1;
  nftw(base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int path_is(const char *kind, const char *fmt, const char *a) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, fmt, a);
  struct stat st;
  if (lstat(p, &st) < 0) return 0;
  if (!strcmp(kind, "dir")) return S_ISDIR(st.st_mode);
  if (!strcmp(kind, "file")) return S_ISREG(st.st_mode);
  if (!strcmp(kind, "link")) return S_ISLNK(st.st_mode);
  return 1;
}

static void touch(const char *path) {
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
  cr_assert_eq(write(fd, "x", 1), 1);
  close(fd);
}

static int count_entries(const char *dir) {
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
  FILE *f = popen(cmd, "r");
  int n = -1;
  if (f) {
    if (fscanf(f, "%d", &n) != 1) n = -1;
    pclose(f);
  }
  return n;
}

/* ------------------------------------------------------------------------ *
 * Relative paths and names
 * ------------------------------------------------------------------------ */
Test(pathsafe, rel_accepts_plain_relative_paths) {
  sd_error err;
  cr_expect_eq(sd_path_check_rel("ckpt", &err), 0);
  cr_expect_eq(sd_path_check_rel("runs/exp-1/step_100", &err), 0);
  cr_expect_eq(sd_path_check_rel("...", &err), 0, "three dots is a plain name");
  cr_expect_eq(sd_path_check_rel(".hidden/x", &err), 0);
}

Test(pathsafe, rel_refuses_escapes_and_empty_parts) {
  const char *bad[] = {"", "/abs", "/", "..", ".", "a/..", "../a", "a/../b", "./a", "a/./b",
                       "a//b", "a/", "a/b/"};
  const char *why[] = {"empty", "absolute", "absolute", "'..'", "'.'", "'..'", "'..'", "'..'",
                       "'.'", "'.'", "empty part", "empty part", "empty part"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    sd_error err;
    sd_error_clear(&err);
    cr_expect_eq(sd_path_check_rel(bad[i], &err), SHARDD_E_BAD_PATH, "'%s' accepted", bad[i]);
    cr_expect_eq(err.code, SHARDD_E_BAD_PATH);
    cr_expect_not_null(strstr(err.msg, why[i]), "'%s': message '%s' lacks '%s'", bad[i], err.msg,
                       why[i]);
  }
  sd_error err;
  cr_expect_eq(sd_path_check_rel(NULL, &err), SHARDD_E_BAD_PATH);
}

Test(pathsafe, rel_is_bounded) {
  char longp[SD_REL_PATH_MAX + 2];
  for (size_t i = 0; i < sizeof longp - 1; i++) longp[i] = (i % 100 == 99) ? '/' : 'a';
  longp[SD_REL_PATH_MAX] = '\0'; /* exactly the limit */
  if (longp[SD_REL_PATH_MAX - 1] == '/') longp[SD_REL_PATH_MAX - 1] = 'a';
  sd_error err;
  cr_expect_eq(sd_path_check_rel(longp, &err), 0, "%s", err.msg);
  longp[SD_REL_PATH_MAX] = 'a';
  longp[SD_REL_PATH_MAX + 1] = '\0';
  cr_expect_eq(sd_path_check_rel(longp, &err), SHARDD_E_BAD_PATH);
  cr_expect_not_null(strstr(err.msg, "longer than"), "%s", err.msg);

  char part[NAME_MAX + 3];
  memset(part, 'p', sizeof part - 1);
  part[sizeof part - 1] = '\0';
  cr_expect_eq(sd_path_check_rel(part, &err), SHARDD_E_BAD_PATH, "a %zu-byte part", strlen(part));
}

Test(pathsafe, names_are_plain) {
  sd_error err;
  cr_expect_eq(sd_path_check_name("config.json", &err), 0);
  cr_expect_eq(sd_path_check_name(".env", &err), 0);
  const char *bad[] = {"", ".", "..", "a/b", "/etc", "x/"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect_eq(sd_path_check_name(bad[i], &err), SHARDD_E_BAD_PATH, "'%s' accepted", bad[i]);
  cr_expect_eq(sd_path_check_name(NULL, &err), SHARDD_E_BAD_PATH);
}

/* ------------------------------------------------------------------------ *
 * The root and resolution beneath it
 * ------------------------------------------------------------------------ */
Test(pathsafe, root_is_created_when_missing, .init = setup, .fini = teardown) {
  char deep[256];
  snprintf(deep, sizeof deep, "%s/new/er/root", base);
  int fd;
  sd_error err;
  cr_assert_eq(sd_root_open(deep, &fd, &err), 0, "%s", err.msg);
  cr_expect(path_is("dir", "%s", deep));
  struct stat st;
  cr_assert_eq(stat(deep, &st), 0);
  mode_t mask = umask(022);
  umask(mask);
  cr_expect_eq(st.st_mode & 0777, 0755 & ~mask);
  int exists;
  cr_expect_eq(sd_path_exists(fd, "x", &exists, &err), 0);
  cr_expect_eq(exists, 0);
  close(fd);

  char file[256];
  snprintf(file, sizeof file, "%s/plainfile", base);
  touch(file);
  cr_expect_neq(sd_root_open(file, &fd, &err), 0, "a file is not a root");
  cr_expect_eq(fd, -1);
}

Test(pathsafe, exists_sees_files_and_folders, .init = setup, .fini = teardown) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/a", root);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/a/f", root);
  touch(p);
  sd_error err;
  int exists = -1;
  cr_expect_eq(sd_path_exists(root_fd, "a", &exists, &err), 0);
  cr_expect_eq(exists, 1);
  cr_expect_eq(sd_path_exists(root_fd, "a/f", &exists, &err), 0);
  cr_expect_eq(exists, 1);
  cr_expect_eq(sd_path_exists(root_fd, "a/missing", &exists, &err), 0);
  cr_expect_eq(exists, 0);
  cr_expect_eq(sd_path_exists(root_fd, "missing/deeper", &exists, &err), 0);
  cr_expect_eq(exists, 0);
  cr_expect_eq(sd_path_exists(root_fd, "a/f/under-a-file", &exists, &err), SHARDD_E_BAD_PATH);
  cr_expect_not_null(strstr(err.msg, "not a folder"), "%s", err.msg);
  cr_expect_eq(sd_path_exists(root_fd, "../root", &exists, &err), SHARDD_E_BAD_PATH);
  cr_expect_eq(sd_path_exists(root_fd, "/tmp", &exists, &err), SHARDD_E_BAD_PATH);
}

Test(pathsafe, exists_refuses_symlinks_anywhere, .init = setup, .fini = teardown) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/link", root);
  cr_assert_eq(symlink(outside, p), 0);
  snprintf(p, sizeof p, "%s/ckpt", outside);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/inner", root);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/inner/rel", root);
  cr_assert_eq(symlink("..", p), 0); /* stays inside, still a symlink: refused */

  sd_error err;
  int exists = -1;
  cr_expect_eq(sd_path_exists(root_fd, "link/ckpt", &exists, &err), SHARDD_E_BAD_PATH);
  cr_expect_not_null(strstr(err.msg, "link/ckpt"), "message names the path: %s", err.msg);
  cr_expect_not_null(strstr(err.msg, "symlink"), "%s", err.msg);
  cr_expect_eq(sd_path_exists(root_fd, "link", &exists, &err), SHARDD_E_BAD_PATH);
  cr_expect_eq(sd_path_exists(root_fd, "inner/rel/inner", &exists, &err), SHARDD_E_BAD_PATH);
  cr_expect_eq(exists, 0);
}

/* ------------------------------------------------------------------------ *
 * Parent folders
 * ------------------------------------------------------------------------ */
Test(pathsafe, parents_are_created_and_taken_back, .init = setup, .fini = teardown) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/runs", root);
  mkdir(p, 0755);
  int pfd;
  unsigned created;
  const char *b;
  sd_error err;
  cr_assert_eq(sd_path_open_parent(root_fd, "runs/exp/seed1/ckpt", 1, &pfd, &created, &b, &err),
               0, "%s", err.msg);
  cr_expect_eq(created, 2);
  cr_expect_str_eq(b, "ckpt");
  cr_expect(path_is("dir", "%s/runs/exp/seed1", root));
  /* the fd is the parent itself, usable for fsync */
  cr_expect_eq(mkdirat(pfd, "probe", 0755), 0);
  cr_expect(path_is("dir", "%s/runs/exp/seed1/probe", root));
  cr_expect_eq(fsync(pfd), 0);
  unlinkat(pfd, "probe", AT_REMOVEDIR);
  close(pfd);

  sd_path_unmake_parents(root_fd, "runs/exp/seed1/ckpt", created);
  cr_expect(!path_is("any", "%s/runs/exp", root), "created folders are removed");
  cr_expect(path_is("dir", "%s/runs", root), "the folder that was there stays");

  /* top level: the root itself is the parent */
  cr_assert_eq(sd_path_open_parent(root_fd, "ckpt", 1, &pfd, &created, &b, &err), 0);
  cr_expect_eq(created, 0);
  cr_expect_str_eq(b, "ckpt");
  close(pfd);
}

Test(pathsafe, unmake_keeps_folders_that_are_not_empty, .init = setup, .fini = teardown) {
  int pfd;
  unsigned created;
  const char *b;
  sd_error err;
  cr_assert_eq(sd_path_open_parent(root_fd, "a/b/c", 1, &pfd, &created, &b, &err), 0);
  close(pfd);
  cr_assert_eq(created, 2);
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/a/other", root);
  mkdir(p, 0755); /* another save's folder beside ours */
  sd_path_unmake_parents(root_fd, "a/b/c", created);
  cr_expect(!path_is("any", "%s/a/b", root));
  cr_expect(path_is("dir", "%s/a/other", root));
}

Test(pathsafe, parents_through_a_symlink_are_refused, .init = setup, .fini = teardown) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/link", root);
  cr_assert_eq(symlink(outside, p), 0);
  int pfd;
  unsigned created = 99;
  const char *b;
  sd_error err;
  cr_expect_eq(sd_path_open_parent(root_fd, "link/ckpt", 1, &pfd, &created, &b, &err),
               SHARDD_E_BAD_PATH);
  cr_expect_eq(pfd, -1);
  cr_expect_eq(created, 0);
  cr_expect_eq(sd_path_open_parent(root_fd, "link/deeper/ckpt", 1, &pfd, &created, &b, &err),
               SHARDD_E_BAD_PATH);
  cr_expect_eq(count_entries(outside), 0, "nothing was created outside the root");
  /* a file in the way is not a folder */
  snprintf(p, sizeof p, "%s/file", root);
  touch(p);
  cr_expect_eq(sd_path_open_parent(root_fd, "new/file/ckpt", 1, &pfd, &created, &b, &err), 0,
               "new/file is made fresh: %s", err.msg);
  close(pfd);
  cr_expect_eq(sd_path_open_parent(root_fd, "file/ckpt", 1, &pfd, &created, &b, &err),
               SHARDD_E_BAD_PATH);
  cr_expect_not_null(strstr(err.msg, "not a folder"), "%s", err.msg);
}

/* ------------------------------------------------------------------------ *
 * Removal and stale temporary folders
 * ------------------------------------------------------------------------ */
Test(pathsafe, remove_tree_never_follows_symlinks, .init = setup, .fini = teardown) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/victim", outside);
  touch(p);
  snprintf(p, sizeof p, "%s/t", root);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/t/sub", root);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/t/sub/f", root);
  touch(p);
  snprintf(p, sizeof p, "%s/t/out", root);
  cr_assert_eq(symlink(outside, p), 0);
  snprintf(p, sizeof p, "%s/t/outfile", root);
  char target[256];
  snprintf(target, sizeof target, "%s/victim", outside);
  cr_assert_eq(symlink(target, p), 0);
  sd_error err;
  cr_expect_eq(sd_path_remove_tree(root_fd, "t", &err), 0, "%s", err.msg);
  cr_expect(!path_is("any", "%s/t", root));
  cr_expect(path_is("file", "%s/victim", outside), "the symlinks' target is untouched");
  cr_expect_eq(sd_path_remove_tree(root_fd, "t", &err), 0, "already gone is fine");
}

Test(pathsafe, cleanup_removes_only_temporary_folders, .init = setup, .fini = teardown) {
  const char *dirs[] = {".shardd-tmp-ckpt-s1-10-1", ".shardd-tmp-ckpt-s1-10-1/nested",
                        "runs", "runs/exp", "runs/exp/.shardd-tmp-step2-s2-10-2",
                        "runs/exp/step1", "runs/exp/step1/.shardd-tmp-deeper-x-1-1",
                        ".shardd-other", "keep"};
  char p[PATH_MAX];
  for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
    snprintf(p, sizeof p, "%s/%s", root, dirs[i]);
    cr_assert_eq(mkdir(p, 0755), 0, "%s", p);
  }
  snprintf(p, sizeof p, "%s/.shardd-tmp-ckpt-s1-10-1/nested/model.safetensors", root);
  touch(p);
  snprintf(p, sizeof p, "%s/runs/exp/step1/model.safetensors", root);
  touch(p);
  snprintf(p, sizeof p, "%s/.shardd-tmp-plainfile", root);
  touch(p); /* a file with the prefix is not a temporary folder */
  /* a symlink into a folder outside that holds something temp-named: not followed */
  snprintf(p, sizeof p, "%s/.shardd-tmp-outside", outside);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/runs/out", root);
  cr_assert_eq(symlink(outside, p), 0);
  snprintf(p, sizeof p, "%s/.shardd-tmp-link", root);
  cr_assert_eq(symlink(outside, p), 0);

  sd_error err;
  cr_assert_eq(sd_cleanup_stale(root_fd, &err), 0, "%s", err.msg);
  cr_expect(!path_is("any", "%s/.shardd-tmp-ckpt-s1-10-1", root));
  cr_expect(!path_is("any", "%s/runs/exp/.shardd-tmp-step2-s2-10-2", root));
  cr_expect(!path_is("any", "%s/runs/exp/step1/.shardd-tmp-deeper-x-1-1", root));
  cr_expect(path_is("file", "%s/runs/exp/step1/model.safetensors", root));
  cr_expect(path_is("dir", "%s/.shardd-other", root));
  cr_expect(path_is("dir", "%s/keep", root));
  cr_expect(path_is("file", "%s/.shardd-tmp-plainfile", root));
  cr_expect(path_is("link", "%s/.shardd-tmp-link", root));
  cr_expect(path_is("link", "%s/runs/out", root));
  cr_expect(path_is("dir", "%s/.shardd-tmp-outside", outside), "outside the root is untouched");
}
