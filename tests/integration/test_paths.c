/* Destinations: '..', absolute and symlink escapes refused with nothing made outside; existing folders and overwrite. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

TestSuite(paths, .init = h_setup, .fini = h_teardown, .timeout = 100);

static const h_put two_puts[] = {
    {.rank = 0, .name = "w", .dtype = "F32", .ndim = 2, .shape = {4, 3}, .boxed = 1, .start = {0, 0},
     .count = {1, 3}},
    {.rank = 1, .name = "w", .dtype = "F32", .ndim = 2, .shape = {4, 3}, .boxed = 1, .start = {1, 0},
     .count = {3, 3}},
};

/* Runs a two-rank save to dir and returns its script (results in s.sh). */
static h_script run_save(const char *save, const char *dir, int overwrite, uint64_t seed) {
  h_script s = {.opts = {.save = save, .dir = dir, .world_size = 2, .overwrite = overwrite},
                .puts = two_puts, .nputs = 2, .seed = seed, .wait_after_fail = 1};
  h_run(&s);
  return s;
}

/* begin must fail for both ranks with bad_path and a message holding frag. */
static void expect_refused(const char *dir, int overwrite, const char *frag) {
  h_script s = run_save("esc", dir, overwrite, 60);
  for (int r = 0; r < 2; r++) {
    const h_result *x = &s.sh->r[r];
    cr_assert_str_eq(x->step, "begin", "dir '%s': rank %d got past begin (%s)", dir, r, x->msg);
    cr_assert_eq(x->rc, SHARDD_E_BAD_PATH, "dir '%s': rank %d: %s", dir, r, x->msg);
    cr_assert(strstr(x->msg, "bad_path: "), "%s", x->msg);
    if (frag) cr_assert(strstr(x->msg, frag), "dir '%s': message '%s' lacks '%s'", dir, x->msg, frag);
  }
  h_shared_free(s.sh);
  cr_assert_eq(h_dir_count(H.outside), 0, "dir '%s' created something outside the root", dir);
  cr_assert_eq(h_tmp_count(), 0);
}

/* ------------------------------------------------------------------------ *
 * Lexical escapes
 * ------------------------------------------------------------------------ */
Test(paths, dotdot_absolute_and_empty_parts_are_refused) {
  char abs[PATH_MAX + 8];
  snprintf(abs, sizeof abs, "%s/ck", H.outside);
  struct {
    const char *dir, *frag;
  } cases[] = {
      {"../escape", "'..' part"},   {"a/../../escape", "'..' part"}, {"ck/..", "'..' part"},
      {"..", "'..' part"},          {"a/./b", "'.' part"},           {"a//b", "empty part"},
      {"a/b/", "empty part"},       {abs, "absolute"},               {"/etc", "absolute"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    expect_refused(cases[i].dir, 0, cases[i].frag);
    expect_refused(cases[i].dir, 1, cases[i].frag);
  }
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/escape", H.base);
  cr_assert(!h_exists(p), "%s was created", p);
  cr_assert_eq(h_dir_count(H.root), 0, "refused saves left something in the root");
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * Symlinks planted in the root
 * ------------------------------------------------------------------------ */
static void plant(const char *target, const char *rel) {
  char p[PATH_MAX];
  h_path(p, sizeof p, rel);
  cr_assert_eq(symlink(target, p), 0, "symlink %s: %s", p, strerror(errno));
}

Test(paths, symlinks_in_the_root_are_not_followed) {
  char p[PATH_MAX];
  plant(H.outside, "link");                                    /* absolute target outside */
  plant("..", "up");                                           /* relative target outside */
  cr_assert_eq(mkdir(h_path(p, sizeof p, "real"), 0755), 0);
  plant(H.outside, "real/inner");                              /* deeper in the path */
  cr_assert_eq(mkdir(h_path(p, sizeof p, "inroot"), 0755), 0);
  plant("inroot", "sibling");                                  /* even one that stays inside */
  const char *through[] = {"link/ck", "link/a/b/ck", "up/ck", "up/outside/ck", "real/inner/ck", "sibling/ck"};
  for (size_t i = 0; i < sizeof through / sizeof through[0]; i++) {
    expect_refused(through[i], 0, "symlink");
    expect_refused(through[i], 1, "symlink");
  }
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "inroot")), 0);

  /* The symlink itself as the destination: refused too, with or without
   * overwrite (which must not write through it, nor replace it). */
  expect_refused("link", 0, "symlink");
  expect_refused("link", 1, "symlink");
  expect_refused("real/inner", 1, "symlink");
  struct stat st;
  cr_assert_eq(lstat(h_path(p, sizeof p, "real/inner"), &st), 0);
  cr_assert(S_ISLNK(st.st_mode), "the planted symlink was replaced");
  cr_assert_eq(h_tmp_count(), 0);
  h_expect_serving();
}

/* A symlink swapped in after begin, before the write: caught at publish. */
static void swap_in_symlink(const h_script *s, int rank, int point, shardd_client *c) {
  (void)c;
  if (rank != 0 || point != H_AT_PUTS) return;
  char p[PATH_MAX], q[PATH_MAX];
  const char *what = s->ud;
  if (!strcmp(what, "replace")) {
    /* late/ existed at begin; move it away and put a symlink in its place */
    h_path(q, sizeof q, "late-moved");
    if (rename(h_path(p, sizeof p, "late"), q) != 0) h_result_fail(&s->sh->r[0], "rename", -errno, NULL);
  }
  if (symlink(H.outside, h_path(p, sizeof p, "late")) != 0) h_result_fail(&s->sh->r[0], "symlink", -errno, NULL);
}

Test(paths, symlink_planted_during_the_save_is_caught) {
  const char *modes[] = {"new", "replace"};
  char p[PATH_MAX];
  for (int m = 0; m < 2; m++) {
    if (m == 1) cr_assert_eq(mkdir(h_path(p, sizeof p, "late"), 0755), 0);
    char save[16];
    snprintf(save, sizeof save, "late-%d", m);
    h_script s = {.opts = {.save = save, .dir = "late/a/ck", .world_size = 2}, .puts = two_puts, .nputs = 2,
                  .seed = 63, .hook = swap_in_symlink, .ud = (void *)modes[m], .wait_after_fail = 1};
    h_run(&s);
    h_expect_failed(&s, SHARDD_E_BAD_PATH, "late", (char *)NULL);
    cr_assert_eq(h_dir_count(H.outside), 0, "the save wrote through a symlink planted mid-save");
    cr_assert_eq(h_tmp_count(), 0);
    h_shared_free(s.sh);
    cr_assert_eq(unlink(h_path(p, sizeof p, "late")), 0);
  }
  h_expect_serving();
}

/* ------------------------------------------------------------------------ *
 * Existing destinations
 * ------------------------------------------------------------------------ */
Test(paths, existing_dir_is_refused_unless_overwrite) {
  char p[PATH_MAX];
  cr_assert_eq(mkdir(h_path(p, sizeof p, "ck"), 0755), 0);
  cr_assert_eq(mkdir(h_path(p, sizeof p, "ck/step"), 0755), 0);
  FILE *f = fopen(h_path(p, sizeof p, "ck/step/marker"), "w");
  cr_assert_not_null(f);
  fputs("old", f);
  fclose(f);

  h_script s = run_save("ex", "ck/step", 0, 64);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(s.sh->r[r].rc, SHARDD_E_EXISTS, "rank %d: %s", r, s.sh->r[r].msg);
    cr_assert(strstr(s.sh->r[r].msg, "'ck/step' already exists"), "%s", s.sh->r[r].msg);
  }
  h_shared_free(s.sh);
  cr_assert(h_exists(h_path(p, sizeof p, "ck/step/marker")), "a refused save touched the existing folder");

  /* overwrite replaces the folder whole */
  s = run_save("ow1", "ck/step", 1, 65);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert(!h_exists(h_path(p, sizeof p, "ck/step/marker")), "overwrite kept the old folder's files");
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "ck/step")), 1);
  h_shared_free(s.sh);

  /* a committed checkpoint is refused too, and overwritten with new bytes */
  s = run_save("ex2", "ck/step", 0, 66);
  cr_assert_eq(s.sh->r[0].rc, SHARDD_E_EXISTS, "%s", s.sh->r[0].msg);
  h_shared_free(s.sh);
  s = run_save("ow2", "ck/step", 1, 67);
  h_expect_committed(&s);
  h_check_script(&s); /* seed 67's bytes, not 65's */
  h_shared_free(s.sh);
  cr_assert_eq(h_tmp_count(), 0, "overwrite left the old folder behind");
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "ck")), 1);

  /* a plain file in the way is refused the same way */
  f = fopen(h_path(p, sizeof p, "plainfile"), "w");
  cr_assert_not_null(f);
  fclose(f);
  s = run_save("ex3", "plainfile", 0, 68);
  cr_assert_eq(s.sh->r[0].rc, SHARDD_E_EXISTS, "%s", s.sh->r[0].msg);
  h_shared_free(s.sh);
  h_expect_serving();
}

/* Two saves in flight may not share a destination. */
static void second_save_same_dir(const h_script *s, int rank, int point, shardd_client *c) {
  if (rank != 0 || point != H_AT_PUTS) return;
  h_result *r = &s->sh->r[0];
  shardd_client *o = NULL;
  int rc = shardd_connect(H.sock, &o);
  shardd_save_opts other = {.save = "intruder", .dir = s->opts.dir, .rank = 0, .world_size = 1};
  if (!rc) rc = shardd_begin(o, &other);
  if (rc != SHARDD_E_CONFLICT || !strstr(shardd_last_error(o), "'dup'") ||
      !strstr(shardd_last_error(o), "save 'dup-1'"))
    h_result_fail(r, "intruder", rc ? rc : -999, o);
  shardd_close(o);
  (void)c;
}

Test(paths, same_dir_in_flight_twice_is_a_conflict) {
  h_script s = {.opts = {.save = "dup-1", .dir = "dup", .world_size = 2}, .puts = two_puts, .nputs = 2,
                .seed = 69, .hook = second_save_same_dir};
  h_run(&s);
  h_expect_committed(&s); /* the first save is unharmed */
  h_check_script(&s);
  h_shared_free(s.sh);
  h_expect_serving();
}
