/* Path resolution beneath the root without openat2 (old kernels, valgrind): the part-by-part walk refuses exactly what openat2 refuses. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pathsafe.h"
#include "publish.h"

/* Makes openat2 fail with ENOSYS in this (criterion's per-test) process, as
 * on a kernel before 5.6. */
static void forbid_openat2(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
  cr_assert_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
  cr_assert_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0, "seccomp: %s", strerror(errno));
  struct open_how_stub { uint64_t flags, mode, resolve; } how = {O_RDONLY, 0, 0};
  cr_assert_eq(syscall(SYS_openat2, AT_FDCWD, "/", &how, sizeof how), -1);
  cr_assert_eq(errno, ENOSYS, "openat2 is still there");
}

static char base[64];
static int root_fd = -1;

/* ROOT/a/b/, ROOT/a/link -> b, ROOT/a/abs -> ROOT/a/b (absolute, inside the
 * root), ROOT/esc -> /tmp, ROOT/a/b/file. */
static void make_tree(void) {
  snprintf(base, sizeof base, "/tmp/sd-fallback-XXXXXX");
  cr_assert_not_null(mkdtemp(base));
  char p[256], q[256];
  snprintf(p, sizeof p, "%s/a", base);
  cr_assert_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/a/b", base);
  cr_assert_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/a/link", base);
  cr_assert_eq(symlink("b", p), 0);
  snprintf(q, sizeof q, "%s/a/b", base);
  snprintf(p, sizeof p, "%s/a/abs", base);
  cr_assert_eq(symlink(q, p), 0);
  snprintf(p, sizeof p, "%s/esc", base);
  cr_assert_eq(symlink("/tmp", p), 0);
  snprintf(p, sizeof p, "%s/a/b/file", base);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs("x", f);
  fclose(f);
  root_fd = open(base, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cr_assert(root_fd >= 0);
}

static void remove_tree(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
}

static int openb(const char *path, int flags) {
  int fd = sd_openat_beneath(root_fd, path, flags, 0644);
  if (fd >= 0) close(fd);
  return fd >= 0 ? 0 : fd;
}

/* The same expectations hold with and without openat2. */
static void check_rules(void) {
  cr_assert_eq(openb("a", O_RDONLY | O_DIRECTORY), 0);
  cr_assert_eq(openb("a/b", O_PATH), 0);
  cr_assert_eq(openb("a/b/file", O_RDONLY), 0);
  cr_assert_eq(openb(".", O_RDONLY | O_DIRECTORY), 0);
  /* a symlink anywhere, pointing inside the root or out, is refused */
  cr_assert_eq(openb("a/link", O_PATH), -ELOOP);
  cr_assert_eq(openb("a/link", O_RDONLY | O_DIRECTORY), -ELOOP);
  cr_assert_eq(openb("a/link/file", O_RDONLY), -ELOOP);
  cr_assert_eq(openb("a/abs/file", O_RDONLY), -ELOOP);
  cr_assert_eq(openb("esc", O_PATH | O_DIRECTORY), -ELOOP);
  cr_assert_eq(openb("esc/x", O_RDONLY), -ELOOP);
  /* leaving the root */
  cr_assert_eq(openb("../x", O_RDONLY), -EXDEV);
  cr_assert_eq(openb("a/../../x", O_RDONLY), -EXDEV);
  cr_assert_eq(openb("/etc/passwd", O_RDONLY), -EXDEV);
  /* creating through a symlink creates nothing */
  cr_assert_eq(openb("a/link/new", O_CREAT | O_WRONLY), -ELOOP);
  char p[256];
  snprintf(p, sizeof p, "%s/a/b/new", base);
  struct stat st;
  cr_assert_neq(lstat(p, &st), 0, "a file was created through a symlink");
  cr_assert_eq(openb("a/b/new", O_CREAT | O_WRONLY), 0);
  cr_assert_eq(lstat(p, &st), 0);
  cr_assert_eq(openb("a/nothere/x", O_RDONLY), -ENOENT);
  cr_assert_eq(openb("a/b/file/x", O_RDONLY), -ENOTDIR);
  /* the helpers built on it */
  sd_error err = {0};
  int exists = 0;
  cr_assert_eq(sd_path_exists(root_fd, "a/link/x", &exists, &err), SHARDD_E_BAD_PATH);
  cr_assert_eq(sd_path_exists(root_fd, "a/b/file", &exists, &err), 0);
  cr_assert_eq(exists, 1);
  int pfd = -1;
  unsigned created = 0;
  const char *leaf = NULL;
  cr_assert_eq(sd_path_open_parent(root_fd, "a/link/ck", 1, &pfd, &created, &leaf, &err), SHARDD_E_BAD_PATH);
  cr_assert_eq(sd_path_open_parent(root_fd, "a/b/c/d/ck", 1, &pfd, &created, &leaf, &err), 0, "%s", err.msg);
  cr_assert_eq(created, 2);
  cr_assert_str_eq(leaf, "ck");
  close(pfd);
}

TestSuite(pathsafe_fallback, .init = make_tree, .fini = remove_tree);

Test(pathsafe_fallback, with_openat2) { check_rules(); }

Test(pathsafe_fallback, without_openat2_the_walk_refuses_the_same) {
  forbid_openat2();
  check_rules();
}
