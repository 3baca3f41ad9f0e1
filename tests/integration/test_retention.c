/* Retention: the delete op and keep_last, against a real daemon and real folders (owner only, shardd's folders only, under the root only). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "host_facts.h"
#include "xclient.h"

TestSuite(retention, .init = x_init, .fini = x_fini, .timeout = 120);

/* A one-rank save of dir with one inline tensor; keep_last 0 leaves it out. */
static void save_lines(char l[4][320], const char *save, const char *dir, unsigned keep_last) {
  char kl[32] = "";
  if (keep_last) snprintf(kl, sizeof kl, ",\"keep_last\":%u", keep_last);
  snprintf(l[0], 320, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1%s}", save, dir, kl);
  snprintf(l[1], 320, "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2],\"data\":\"AQI=\"}",
           save);
  snprintf(l[2], 320, "{\"op\":\"seal\",\"save\":\"%s\"}", save);
  snprintf(l[3], 320, "{\"op\":\"wait\",\"save\":\"%s\"}", save);
}

/* Saves dir on c and waits; the status round trip after it orders us behind
 * the daemon's keep_last pass, which runs right after the wait's answer. */
static void save_on(x_conn *c, const char *save, const char *dir, unsigned keep_last) {
  char l[4][320];
  save_lines(l, save, dir, keep_last);
  for (int i = 0; i < 4; i++) x_ok(x_call(c, l[i]), l[i]);
  x_status_ok(c, -1);
}

/* r is ok and names the deleted folder by its path under the root; releases r. */
static void x_json_ok_dir(json_t *r, const char *rel) {
  cr_assert(json_is_true(json_object_get(r, "ok")), "delete %s: %s", rel, json_dumps(r, 0));
  const char *dir = json_string_value(json_object_get(r, "dir"));
  cr_assert(dir && strcmp(dir, rel) == 0, "delete %s reports dir '%s'", rel, dir ? dir : "(none)");
  json_decref(r);
}

static int count_prefix(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d))) n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

/* The removal runs on a worker thread after the reply: wait (bounded, for a hang only) until no hidden name is left. */
static void expect_no_hidden(const char *rel) {
  char p[PATH_MAX];
  h_path(p, sizeof p, rel);
  for (int i = 0; i < 3000 && count_prefix(p, ".shardd-del-"); i++) usleep(10000);
  cr_assert_eq(count_prefix(p, ".shardd-del-"), 0, "a folder being deleted is left in %s", p);
}

static int run_as(uid_t uid, const x_step *steps, size_t n) { return x_steps_as(uid, TH_G_OTHER, steps, n); }

static int save_as(uid_t uid, const char *save, const char *dir, unsigned keep_last) {
  char l[4][320];
  save_lines(l, save, dir, keep_last);
  x_step s[4];
  for (int i = 0; i < 4; i++) s[i] = (x_step){l[i], "\"ok\":true"};
  return run_as(uid, s, 4);
}

static void start_open(void) {
  cr_assert_eq(chmod(H.base, 0755), 0, "chmod %s", H.base);
  const char *flags[] = {"--socket-mode", "0666", NULL};
  x_start(flags);
}

/* A folder made by hand beside the checkpoints, with a file that looks like one. */
static void hand_made(const char *rel) {
  char p[PATH_MAX], f[PATH_MAX + 32];
  cr_assert_eq(mkdir(h_path(p, sizeof p, rel), 0755), 0, "mkdir %s: %s", p, strerror(errno));
  snprintf(f, sizeof f, "%s/model.safetensors", p);
  FILE *fp = fopen(f, "w");
  cr_assert_not_null(fp);
  fputs("not really", fp);
  fclose(fp);
}

/* ------------------------------------------------------------------------ */
Test(retention, owner_deletes_its_checkpoint) {
  x_start(NULL);
  x_conn *c = x_connect();
  save_on(c, "d1", "runs/a", 0);
  save_on(c, "d2", "runs/b", 0);
  h_verify_ok("runs/a");
  char p[PATH_MAX];
  x_json_ok_dir(x_callf(c, "{\"op\":\"delete\",\"dir\":\"runs/a\",\"id\":7}"), "runs/a");
  cr_assert(!h_exists(h_path(p, sizeof p, "runs/a")), "runs/a is still there after its delete");
  /* the absolute path `wait` reports works too */
  char abs[PATH_MAX];
  h_path(abs, sizeof abs, "runs/b");
  x_json_ok_dir(x_callf(c, "{\"op\":\"delete\",\"dir\":\"%s\"}", abs), "runs/b");
  cr_assert(!h_exists(abs), "runs/b is still there after its delete");
  expect_no_hidden("runs");
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "runs")), 0, "runs/ is not empty after both deletes");
  /* deleted twice: gone */
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"runs/a\"}"), "not_found", "'runs/a' does not exist", "a second delete");
  x_err(x_call(c, "{\"op\":\"delete\"}"), "invalid_argument", "'dir'", "delete without dir");
  x_close(c);
  x_serving();
}

Test(retention, another_uid_may_not_delete) {
  TH_NEED_ROOT("run clients as other uids");
  start_open();
  cr_assert_eq(save_as(TH_U_OTHER, "o1", "team/ck", 0), 0, "the owner's save");
  char p[PATH_MAX];
  uint64_t before = x_tree_hash(h_path(p, sizeof p, "team/ck"));
  x_step del = {"{\"op\":\"delete\",\"dir\":\"team/ck\"}", "\"code\":\"permission_denied\""};
  cr_assert_eq(run_as(TH_U_THIRD, &del, 1), 0, "another uid deleted the checkpoint");
  del.want = "'team/ck' was committed by uid 4243; uid 4245 may not delete it";
  cr_assert_eq(run_as(TH_U_THIRD, &del, 1), 0, "the refusal's message");
  /* root is no exception: the daemon cannot tell who may, but the owner */
  x_conn *c = x_connect();
  x_err(x_call(c, del.line), "permission_denied", "committed by uid 4243", "root's delete");
  x_close(c);
  cr_assert_eq(x_tree_hash(p), before, "a refused delete touched the checkpoint");
  del.want = "\"ok\":true";
  cr_assert_eq(run_as(TH_U_OTHER, &del, 1), 0, "the owner's delete");
  cr_assert(!h_exists(p), "team/ck is still there");
  expect_no_hidden("team");
  x_serving();
}

Test(retention, folders_shardd_did_not_write_are_refused_and_untouched) {
  x_start(NULL);
  x_conn *c = x_connect();
  char p[PATH_MAX], q[PATH_MAX];
  hand_made("hand");
  uint64_t before = x_tree_hash(h_path(p, sizeof p, "hand"));
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"hand\"}"), "not_a_checkpoint", "'hand' has no recorded owner",
        "a folder made by hand");
  /* an owner attribute set by hand, but no checkpoint file */
  cr_assert_eq(mkdir(h_path(q, sizeof q, "empty"), 0755), 0);
  cr_assert_eq(setxattr(q, "user.shardd.owner", "0", 1, 0), 0, "setxattr: %s", strerror(errno));
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"empty\"}"), "not_a_checkpoint", "'empty' holds no .safetensors",
        "a folder without a checkpoint file");
  cr_assert(h_exists(q));
  /* a plain file */
  FILE *fp = fopen(h_path(q, sizeof q, "notes.txt"), "w");
  cr_assert_not_null(fp);
  fclose(fp);
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"notes.txt\"}"), "not_a_checkpoint", "'notes.txt' is not a folder",
        "a file");
  cr_assert(h_exists(q));
  /* a symlink to a real checkpoint */
  save_on(c, "real", "real", 0);
  char t[PATH_MAX];
  cr_assert_eq(symlink(h_path(t, sizeof t, "real"), h_path(q, sizeof q, "link")), 0);
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"link\"}"), "bad_path", "'link'", "a symlink");
  cr_assert(h_exists(t) && h_exists(q), "the symlink or its target went away");
  /* shardd's own temporary folders are not checkpoints */
  cr_assert_eq(mkdir(h_path(q, sizeof q, ".shardd-tmp-x"), 0755), 0);
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\".shardd-tmp-x\"}"), "bad_path", "reserved", "a temporary folder");
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"a/.shardd-del-x-1\"}"), "bad_path", "reserved", "a deleted folder");
  x_err(x_call(c, "{\"op\":\"begin\",\"save\":\"h\",\"dir\":\".shardd-del-x\",\"rank\":0,\"world_size\":1}"),
        "bad_path", "reserved", "a save to a name start-up removes");
  cr_assert_eq(x_tree_hash(p), before, "a refused delete touched the hand-made folder");
  h_verify_ok("real");
  x_close(c);
  x_serving();
}

Test(retention, paths_outside_the_root_are_refused) {
  x_start(NULL);
  x_conn *c = x_connect();
  char out[PATH_MAX + 16];
  snprintf(out, sizeof out, "%s/victim", H.outside);
  cr_assert_eq(mkdir(out, 0755), 0, "mkdir %s", out);
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"../outside/victim\"}"), "bad_path", NULL, "a '..' path");
  x_err(x_callf(c, "{\"op\":\"delete\",\"dir\":\"%s\"}", out), "bad_path", "is outside the root", "an absolute path");
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"/\"}"), "bad_path", "outside the root", "/");
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"\"}"), "bad_path", NULL, "the root itself");
  char root_dir[PATH_MAX + 8];
  snprintf(root_dir, sizeof root_dir, "%s/", H.root);
  x_err(x_callf(c, "{\"op\":\"delete\",\"dir\":\"%s\"}", root_dir), "bad_path", NULL, "the root, absolute");
  cr_assert(h_exists(out), "the folder outside the root went away");
  x_close(c);
  x_serving();
}

Test(retention, a_checkpoint_a_save_is_writing_to_is_refused) {
  x_start(NULL);
  x_conn *c = x_connect();
  save_on(c, "first", "busy/ck", 0);
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"again\",\"dir\":\"busy/ck\",\"rank\":0,\"world_size\":1,"
                 "\"overwrite\":true}"),
       "begin an overwrite");
  x_err(x_call(c, "{\"op\":\"delete\",\"dir\":\"busy/ck\"}"), "conflict",
        "'busy/ck' is the destination of save 'again'", "delete under a save");
  h_verify_ok("busy/ck");
  x_ok(x_call(c, "{\"op\":\"abort\",\"save\":\"again\"}"), "abort");
  x_ok(x_call(c, "{\"op\":\"delete\",\"dir\":\"busy/ck\"}"), "delete once the save is over");
  x_close(c);
  x_serving();
}

Test(retention, keep_last_keeps_the_newest_of_the_owner_only) {
  TH_NEED_ROOT("run clients as other uids");
  start_open();
  char r[PATH_MAX];
  cr_assert_eq(mkdir(h_path(r, sizeof r, "runs"), 0755), 0);
  hand_made("runs/foreign");
  char p[PATH_MAX];
  uint64_t foreign = x_tree_hash(h_path(p, sizeof p, "runs/foreign"));
  cr_assert_eq(save_as(TH_U_OTHER, "theirs", "runs/theirs", 0), 0, "another uid's checkpoint");
  uint64_t theirs = x_tree_hash(h_path(p, sizeof p, "runs/theirs"));
  x_conn *c = x_connect();
  save_on(c, "s1", "runs/step1", 2);
  save_on(c, "s2", "runs/step2", 2);
  cr_assert(h_exists(h_path(p, sizeof p, "runs/step1")), "keep_last=2 deleted one of two");
  save_on(c, "s3", "runs/step3", 2);
  save_on(c, "s4", "runs/step4", 2);
  cr_assert(!h_exists(h_path(p, sizeof p, "runs/step1")), "runs/step1 is left after 4 saves with keep_last=2");
  cr_assert(!h_exists(h_path(p, sizeof p, "runs/step2")), "runs/step2 is left after 4 saves with keep_last=2");
  h_verify_ok("runs/step3");
  h_verify_ok("runs/step4");
  cr_assert_eq(x_tree_hash(h_path(p, sizeof p, "runs/foreign")), foreign, "keep_last touched a hand-made folder");
  cr_assert_eq(x_tree_hash(h_path(p, sizeof p, "runs/theirs")), theirs, "keep_last touched another uid's checkpoint");
  expect_no_hidden("runs");
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "runs")), 4, "runs/ holds step3, step4, foreign and theirs only");
  /* a sibling folder's checkpoints are another run's */
  save_on(c, "o1", "other/x", 1);
  cr_assert(h_exists(h_path(p, sizeof p, "runs/step3")), "keep_last reached into another folder");
  cr_assert_eq(x_log_count("keep_last=2: deleted 'runs/step1'"), 1, "the deletion is not logged");
  x_close(c);
  x_serving();
}

Test(retention, bad_keep_last_is_refused_naming_the_field) {
  x_start(NULL);
  x_conn *c = x_connect();
  const char *bad[] = {"0", "-1", "\"2\"", "1.5", "true", "1000001"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    x_err(x_callf(c, "{\"op\":\"begin\",\"save\":\"k%zu\",\"dir\":\"k\",\"rank\":0,\"world_size\":1,\"keep_last\":%s}",
                  i, bad[i]),
          "invalid_argument", "'keep_last'", bad[i]);
  /* every rank gives the same keep_last, or the save fails */
  x_conn *c2 = x_connect();
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"two\",\"dir\":\"k/two\",\"rank\":0,\"world_size\":2,\"keep_last\":2}"),
       "rank 0");
  x_err(x_call(c2, "{\"op\":\"begin\",\"save\":\"two\",\"dir\":\"k/two\",\"rank\":1,\"world_size\":2,\"keep_last\":3}"),
        "conflict", "keep_last 3, earlier ranks gave 2", "rank 1");
  x_close(c2);
  x_close(c);
  x_serving();
}

Test(retention, start_up_removes_what_a_crashed_delete_left) {
  char p[PATH_MAX], f[PATH_MAX + 16];
  cr_assert(mkdir(H.root, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", H.root, strerror(errno));
  cr_assert_eq(mkdir(h_path(p, sizeof p, "runs"), 0755), 0);
  cr_assert_eq(mkdir(h_path(p, sizeof p, "runs/.shardd-del-step1-0badf00d"), 0755), 0);
  snprintf(f, sizeof f, "%s/a", p);
  FILE *fp = fopen(f, "w");
  cr_assert_not_null(fp);
  fclose(fp);
  x_start(NULL);
  cr_assert(!h_exists(p), "start-up left %s", p);
  x_serving();
}

Test(retention, shardctl_rm) {
  x_start(NULL);
  x_conn *c = x_connect();
  save_on(c, "r1", "ctl/ck", 0);
  char out[4096], p[PATH_MAX];
  int st = h_shardctl(out, sizeof out, "rm", "ctl/ck", (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shardctl rm failed: %s", out);
  cr_assert(!h_exists(h_path(p, sizeof p, "ctl/ck")), "ctl/ck is still there");
  st = h_shardctl(out, sizeof out, "rm", "ctl/ck", (char *)NULL);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0, "a second shardctl rm succeeded: %s", out);
  cr_assert(strstr(out, "not_found") && strstr(out, "ctl/ck"), "shardctl rm's error: %s", out);
  x_close(c);
  x_serving();
}
