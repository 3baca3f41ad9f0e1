/* Permissions: socket mode and group, peer credentials, shm ownership and trusted groups, save ownership, file modes, symlinks inside the root. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "host_facts.h"
#include "xclient.h"

TestSuite(perms, .init = x_init, .fini = x_fini, .timeout = 120);

/* Lets processes of other uids reach the socket in H.base. */
static void open_up(void) { cr_assert_eq(chmod(H.base, 0755), 0, "chmod %s", H.base); }

/* A segment of `size` bytes owned by uid:gid, mode 0640. */
static void shm_owned(const char *name, uid_t uid, gid_t gid) {
  int fd = x_shm_create(name, 4096, 9, NULL);
  cr_assert_eq(fchown(fd, uid, gid), 0, "fchown: %s", strerror(errno));
  cr_assert_eq(fchmod(fd, 0640), 0);
  close(fd);
}

/* ------------------------------------------------------------------------ */
Test(perms, socket_mode_default_and_configured_with_group) {
  x_start(NULL);
  struct stat st;
  cr_assert_eq(stat(H.sock, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0660, "default socket mode is %o", st.st_mode & 07777);
  h_daemon_stop(&H);
  TH_NEED_ROOT("create other users' segments and clients");
  const char *flags[] = {"--socket-mode", "0600", "--socket-group", "4321", NULL};
  x_start(flags);
  cr_assert_eq(stat(H.sock, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0600, "configured socket mode is %o", st.st_mode & 07777);
  cr_assert_eq(st.st_gid, 4321, "socket group is %u", (unsigned)st.st_gid);
  x_serving();
}

Test(perms, peer_credentials_are_recorded) {
  x_start(NULL);
  x_conn *c = x_connect();
  x_status_ok(c, 0);
  char want[96];
  snprintf(want, sizeof want, "connected (pid %d, uid %u)", (int)getpid(), (unsigned)getuid());
  cr_assert(x_log_count(want) >= 1, "the daemon did not record the peer's pid and uid ('%s')", want);
  x_close(c);
}

Test(perms, shm_attached_only_when_owned_by_the_peer) {
  TH_NEED_ROOT("create other users' segments and clients");
  x_start(NULL);
  char mine[64], theirs[64];
  snprintf(mine, sizeof mine, "/sdxt-mine-%d", (int)getpid());
  snprintf(theirs, sizeof theirs, "/sdxt-theirs-%d", (int)getpid());
  shm_owned(mine, 0, 0);
  shm_owned(theirs, TH_U_OTHER, TH_G_TRUST);
  x_conn *c = x_connect();
  x_ok(x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", mine), "own segment");
  /* root is not special: another user's segment is refused */
  x_err(x_callf(c, "{\"op\":\"attach\",\"shm\":\"%s\"}", theirs), "permission_denied", "owned by uid 4243",
        "another user's segment");
  /* and the owner itself may attach it */
  open_up();
  h_daemon_stop(&H);
  const char *flags[] = {"--socket-mode", "0666", NULL};
  x_start(flags);
  char line[128];
  snprintf(line, sizeof line, "{\"op\":\"attach\",\"shm\":\"%s\"}", theirs);
  x_step own[] = {{line, "\"ok\":true"}};
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, own, 1), 0, "the owner cannot attach its own segment");
  snprintf(line, sizeof line, "{\"op\":\"attach\",\"shm\":\"%s\"}", mine);
  x_step root_s[] = {{line, "\"code\":\"permission_denied\""}};
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, root_s, 1), 0, "a user attached root's segment");
  x_close(c);
  shm_unlink(mine);
  shm_unlink(theirs);
  x_serving();
}

Test(perms, trusted_group_members_may_attach_the_groups_segments) {
  TH_NEED_ROOT("create other users' segments and clients");
  open_up();
  char seg[64];
  snprintf(seg, sizeof seg, "/sdxt-grp-%d", (int)getpid());
  shm_owned(seg, 0, TH_G_TRUST); /* root's segment, group TH_G_TRUST */
  const char *flags[] = {"--socket-mode", "0666", "--trusted-group", "4242", NULL};
  x_start(flags);
  char line[128];
  snprintf(line, sizeof line, "{\"op\":\"attach\",\"shm\":\"%s\"}", seg);
  x_step ok[] = {{line, "\"ok\":true"}};
  x_step no[] = {{line, "\"code\":\"permission_denied\""}};
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_TRUST, ok, 1), 0, "a member of the trusted group (primary) cannot attach");
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, no, 1), 0, "a non-member attached a trusted group's segment");
  /* a segment of another group is still refused to the trusted group's members */
  char other[64];
  snprintf(other, sizeof other, "/sdxt-grp2-%d", (int)getpid());
  shm_owned(other, 0, TH_G_OTHER);
  snprintf(line, sizeof line, "{\"op\":\"attach\",\"shm\":\"%s\"}", other);
  x_step no2[] = {{line, "\"code\":\"permission_denied\""}};
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_TRUST, no2, 1), 0, "a segment outside the trusted group was attached");
  h_daemon_stop(&H);
  /* without the setting, the group does not count */
  const char *plain[] = {"--socket-mode", "0666", NULL};
  x_start(plain);
  snprintf(line, sizeof line, "{\"op\":\"attach\",\"shm\":\"%s\"}", seg);
  x_step no3[] = {{line, "\"code\":\"permission_denied\""}};
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_TRUST, no3, 1), 0, "group ownership counted without --trusted-group");
  shm_unlink(seg);
  shm_unlink(other);
  x_serving();
}

Test(perms, only_the_uid_that_began_a_save_may_join_put_or_abort_it) {
  TH_NEED_ROOT("create other users' segments and clients");
  open_up();
  const char *flags[] = {"--socket-mode", "0666", NULL};
  x_start(flags);
  x_conn *r0 = x_connect();
  x_ok(x_call(r0, "{\"op\":\"begin\",\"save\":\"own\",\"dir\":\"own/a\",\"rank\":0,\"world_size\":2}"), "begin");
  x_ok(x_call(r0, "{\"op\":\"put\",\"save\":\"own\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2],\"start\":[0],"
                  "\"count\":[1],\"data\":\"AQ==\"}"),
       "put 0");
  x_step intruder[] = {
      {"{\"op\":\"begin\",\"save\":\"own\",\"dir\":\"own/a\",\"rank\":1,\"world_size\":2}",
       "\"code\":\"permission_denied\""},
      {"{\"op\":\"put\",\"save\":\"own\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2],\"start\":[1],\"count\":[1],"
       "\"data\":\"Ag==\"}",
       "\"code\":\"bad_state\""},
      {"{\"op\":\"seal\",\"save\":\"own\"}", "\"code\":\"bad_state\""},
      {"{\"op\":\"abort\",\"save\":\"own\"}", "\"code\":\"permission_denied\""},
      /* with a conflicting dir too: refused before it could fail the save */
      {"{\"op\":\"begin\",\"save\":\"own\",\"dir\":\"elsewhere\",\"rank\":1,\"world_size\":3}",
       "\"code\":\"permission_denied\""},
      /* its own save is its own business */
      {"{\"op\":\"begin\",\"save\":\"theirs\",\"dir\":\"theirs/a\",\"rank\":0,\"world_size\":2}", "\"ok\":true"},
  };
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, intruder, sizeof intruder / sizeof intruder[0]), 0,
               "another uid could touch the save");
  /* the save is unharmed: its own uid joins and it commits */
  x_conn *r1 = x_connect();
  x_ok(x_call(r1, "{\"op\":\"begin\",\"save\":\"own\",\"dir\":\"own/a\",\"rank\":1,\"world_size\":2}"), "join");
  x_ok(x_call(r1, "{\"op\":\"put\",\"save\":\"own\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2],\"start\":[1],"
                  "\"count\":[1],\"data\":\"Ag==\"}"),
       "put 1");
  x_ok(x_call(r0, "{\"op\":\"seal\",\"save\":\"own\"}"), "seal 0");
  x_ok(x_call(r1, "{\"op\":\"seal\",\"save\":\"own\"}"), "seal 1");
  x_ok(x_call(r0, "{\"op\":\"wait\",\"save\":\"own\"}"), "commit");
  const uint8_t want[2] = {1, 2};
  h_check_bytes("own/a", "w", want, 2);
  /* root is no exception: the other user's save (lost with its client) was never root's to join */
  x_close(r0);
  x_close(r1);
  x_serving();
}

Test(perms, checkpoint_modes_default_and_configured_whatever_the_umask) {
  mode_t old = umask(077);
  x_start(NULL);
  umask(old);
  x_serving(); /* commits serving/check-1 */
  char p[PATH_MAX], f[PATH_MAX + 64];
  struct stat st;
  cr_assert_eq(stat(h_path(p, sizeof p, "serving/check-1"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0755, "default folder mode %o under umask 077", st.st_mode & 07777);
  snprintf(f, sizeof f, "%s/model.safetensors", p);
  cr_assert_eq(stat(f, &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0644, "default file mode %o under umask 077", st.st_mode & 07777);
  h_daemon_stop(&H);
  const char *flags[] = {"--file-mode", "0600", "--dir-mode", "0750", NULL};
  x_start(flags);
  x_conn *c = x_connect();
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"m\",\"dir\":\"modes/a\",\"rank\":0,\"world_size\":1}"), "begin");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"m\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}"),
       "put");
  x_ok(x_call(c, "{\"op\":\"file\",\"save\":\"m\",\"path\":\"config.json\",\"data\":\"e30=\"}"), "file");
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"m\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"m\"}"), "wait");
  cr_assert_eq(stat(h_path(p, sizeof p, "modes/a"), &st), 0);
  cr_assert_eq(st.st_mode & 07777, 0750, "configured folder mode %o", st.st_mode & 07777);
  const char *files[] = {"model.safetensors", "config.json"};
  for (int i = 0; i < 2; i++) {
    snprintf(f, sizeof f, "%s/%s", p, files[i]);
    cr_assert_eq(stat(f, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "%s has mode %o", files[i], st.st_mode & 07777);
  }
  x_close(c);
}

/* A symlink inside the root, pointing inside the root, is still never followed. */
Test(perms, symlink_planted_inside_the_root_is_refused) {
  x_start(NULL);
  char p[PATH_MAX], q[PATH_MAX];
  cr_assert_eq(mkdir(h_path(p, sizeof p, "real"), 0755), 0);
  cr_assert_eq(symlink("real", h_path(p, sizeof p, "alias")), 0);
  cr_assert_eq(symlink(h_path(q, sizeof q, "real"), h_path(p, sizeof p, "abs")), 0);
  x_conn *c = x_connect();
  const char *dirs[] = {"alias/ck", "alias", "abs/ck", "abs"};
  for (int i = 0; i < 4; i++) {
    for (int ow = 0; ow < 2; ow++) {
      json_t *r = x_callf(c, "{\"op\":\"begin\",\"save\":\"sl\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1%s}", dirs[i],
                          ow ? ",\"overwrite\":true" : "");
      x_err(r, "bad_path", "symlink", dirs[i]);
    }
  }
  cr_assert_eq(h_dir_count(h_path(p, sizeof p, "real")), 0, "something was written through the symlink");
  struct stat st;
  cr_assert_eq(lstat(h_path(p, sizeof p, "alias"), &st), 0);
  cr_assert(S_ISLNK(st.st_mode), "the planted symlink was replaced");
  /* the real folder itself is fine */
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"sl\",\"dir\":\"real/ck\",\"rank\":0,\"world_size\":1}"), "real/ck");
  x_ok(x_call(c, "{\"op\":\"put\",\"save\":\"sl\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"AQ==\"}"),
       "put");
  x_ok(x_call(c, "{\"op\":\"seal\",\"save\":\"sl\"}"), "seal");
  x_ok(x_call(c, "{\"op\":\"wait\",\"save\":\"sl\"}"), "wait");
  h_verify_ok("real/ck");
  x_close(c);
  x_serving();
}

/* ------------------------------------------------------------------------ *
 * Checkpoint ownership: the uid that committed a folder is recorded on it
 * (xattr user.shardd.owner); overwrite is its owner's (or the trusted group's)
 * ------------------------------------------------------------------------ */
#define TH_U_THIRD 4245

/* The steps of a one-rank save of dir, inline, with or without overwrite. */
static void save_steps(x_step *s, char lines[4][256], const char *save, const char *dir, int overwrite, int value) {
  snprintf(lines[0], 256, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1%s}", save, dir,
           overwrite ? ",\"overwrite\":true" : "");
  snprintf(lines[1], 256,
           "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[1],\"data\":\"%s\"}", save,
           value == 1 ? "AQ==" : value == 2 ? "Ag==" : "Aw==");
  snprintf(lines[2], 256, "{\"op\":\"seal\",\"save\":\"%s\"}", save);
  snprintf(lines[3], 256, "{\"op\":\"wait\",\"save\":\"%s\"}", save);
  for (int i = 0; i < 4; i++) s[i] = (x_step){lines[i], "\"ok\":true"};
}

static unsigned recorded_owner(const char *rel) {
  char p[PATH_MAX], v[32] = "";
  ssize_t n = getxattr(h_path(p, sizeof p, rel), "user.shardd.owner", v, sizeof v - 1);
  cr_assert(n > 0, "%s has no user.shardd.owner: %s", rel, strerror(errno));
  v[n] = 0;
  return (unsigned)strtoul(v, NULL, 10);
}

Test(perms, overwrite_only_of_checkpoints_the_callers_uid_committed) {
  TH_NEED_ROOT("create other users' segments and clients");
  open_up();
  const char *flags[] = {"--socket-mode", "0666", NULL};
  x_start(flags);
  x_step s[4];
  char l[4][256];
  save_steps(s, l, "o1", "owned/ck", 0, 1);
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, s, 4), 0, "the owner's first save");
  cr_assert_eq(recorded_owner("owned/ck"), TH_U_OTHER, "the owner recorded on the folder");
  char p[PATH_MAX];
  uint64_t before = x_tree_hash(h_path(p, sizeof p, "owned/ck"));
  /* another uid: refused at begin, naming the folder and its owner */
  save_steps(s, l, "o2", "owned/ck", 1, 2);
  s[0].want = "committed by uid 4243";
  cr_assert_eq(x_steps_as(TH_U_THIRD, TH_G_OTHER, s, 1), 0, "another uid overwrote the checkpoint");
  s[0].want = "\"code\":\"permission_denied\"";
  cr_assert_eq(x_steps_as(TH_U_THIRD, TH_G_OTHER, s, 1), 0, "the refusal's code");
  /* root is no exception */
  x_conn *c = x_connect();
  x_err(x_call(c, l[0]), "permission_denied", "'owned/ck' was committed by uid 4243", "root's overwrite");
  cr_assert_eq(x_tree_hash(h_path(p, sizeof p, "owned/ck")), before, "the refused overwrites touched the checkpoint");
  /* the same uid replaces its own checkpoint */
  s[0].want = "\"ok\":true";
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, s, 4), 0, "the owner's overwrite");
  const uint8_t two = 2;
  h_check_bytes("owned/ck", "w", &two, 1);
  cr_assert_eq(recorded_owner("owned/ck"), TH_U_OTHER);
  /* a folder nobody recorded (made before this, or by hand): root and the daemon's uid only */
  cr_assert_eq(mkdir(h_path(p, sizeof p, "legacy"), 0777), 0);
  save_steps(s, l, "o3", "legacy", 1, 3);
  s[0].want = "has no recorded owner";
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, s, 1), 0, "a user overwrote a folder without an owner");
  x_ok(x_call(c, l[0]), "root (the daemon's uid) overwrites a folder without an owner");
  x_ok(x_call(c, l[1]), "put");
  x_ok(x_call(c, l[2]), "seal");
  x_ok(x_call(c, l[3]), "wait");
  cr_assert_eq(recorded_owner("legacy"), 0, "root's overwrite records root");
  x_close(c);
  x_serving();
}

Test(perms, trusted_group_members_may_overwrite_any_checkpoint) {
  TH_NEED_ROOT("create other users' segments and clients");
  open_up();
  const char *flags[] = {"--socket-mode", "0666", "--trusted-group", "4242", NULL};
  x_start(flags);
  x_step s[4];
  char l[4][256];
  save_steps(s, l, "t1", "team/ck", 0, 1);
  cr_assert_eq(x_steps_as(TH_U_OTHER, TH_G_OTHER, s, 4), 0, "the first save");
  save_steps(s, l, "t2", "team/ck", 1, 2);
  s[0].want = "members of trusted_group";
  cr_assert_eq(x_steps_as(TH_U_THIRD, TH_G_OTHER, s, 1), 0, "a non-member overwrote another uid's checkpoint");
  s[0].want = "\"ok\":true";
  cr_assert_eq(x_steps_as(TH_U_THIRD, TH_G_TRUST, s, 4), 0, "a member of the trusted group cannot overwrite");
  const uint8_t two = 2;
  h_check_bytes("team/ck", "w", &two, 1);
  cr_assert_eq(recorded_owner("team/ck"), TH_U_THIRD, "the new owner is the member who overwrote it");
  h_verify_ok("team/ck");
  x_serving();
}

/* ------------------------------------------------------------------------ *
 * Who may save where: a committed checkpoint is a closed folder, and a folder
 * shardd made for a uid's checkpoints is that uid's (README "Who may save where")
 * ------------------------------------------------------------------------ */
/* One step of a save as uid that must be refused with `want` in the reply. */
static void refused_as(uid_t uid, const char *dir, int overwrite, const char *want) {
  x_step s[4];
  char l[4][256];
  save_steps(s, l, "nest", dir, overwrite, 3);
  s[0].want = want;
  cr_assert_eq(x_steps_as(uid, TH_G_OTHER, s, 1), 0, "uid %u was not refused '%s' at %s", (unsigned)uid, want, dir);
}

/* A whole one-rank save of dir as uid:gid, which must commit. */
static void saved_as(uid_t uid, gid_t gid, const char *save, const char *dir, int value) {
  x_step s[4];
  char l[4][256];
  save_steps(s, l, save, dir, 0, value);
  cr_assert_eq(x_steps_as(uid, gid, s, 4), 0, "uid %u could not save %s", (unsigned)uid, dir);
}

Test(perms, no_save_inside_a_checkpoint_nor_under_another_uids_folder) {
  TH_NEED_ROOT("run clients as other uids");
  open_up();
  const char *flags[] = {"--socket-mode", "0666", NULL};
  x_start(flags);
  /* uid A's single-file checkpoint: no index, so its name is free inside */
  saved_as(TH_U_OTHER, TH_G_OTHER, "a1", "A/run/step-1", 1);
  char p[PATH_MAX];
  uint64_t before = x_tree_hash(h_path(p, sizeof p, "A/run/step-1"));
  const char *inside[] = {"A/run/step-1/model.safetensors.index.json", "A/run/step-1/sub/deeper"};
  for (int i = 0; i < 2; i++)
    for (int ow = 0; ow < 2; ow++) {
      refused_as(TH_U_THIRD, inside[i], ow, "\"code\":\"conflict\"");
      refused_as(TH_U_THIRD, inside[i], ow, "lies inside the checkpoint 'A/run/step-1', committed by uid 4243");
      /* its owner may not either: a checkpoint is a closed folder */
      refused_as(TH_U_OTHER, inside[i], ow, "\"code\":\"conflict\"");
    }
  /* the folders shardd made for A's checkpoints are A's: B cannot squat the next step */
  refused_as(TH_U_THIRD, "A/run/step-2", 0, "\"code\":\"permission_denied\"");
  refused_as(TH_U_THIRD, "A/run/step-2", 0,
             "'A/run/step-2' lies under 'A', a folder shardd made for uid 4243: uid 4245 may not save beneath it");
  refused_as(TH_U_THIRD, "A/other/x", 0, "a folder shardd made for uid 4243");
  /* root is no exception */
  x_conn *c = x_connect();
  x_err(x_call(c, "{\"op\":\"begin\",\"save\":\"r\",\"dir\":\"A/run/step-2\",\"rank\":0,\"world_size\":1}"),
        "permission_denied", "a folder shardd made for uid 4243", "root under A's folder");
  x_err(x_call(c, "{\"op\":\"begin\",\"save\":\"r\",\"dir\":\"A/run/step-1/sub\",\"rank\":0,\"world_size\":1}"),
        "conflict", "inside the checkpoint 'A/run/step-1'", "root inside A's checkpoint");
  cr_assert_eq(x_tree_hash(h_path(p, sizeof p, "A/run/step-1")), before, "a refused save touched the checkpoint");
  cr_assert_eq(h_exists(h_path(p, sizeof p, "A/run/step-2")), 0, "a refused save left A/run/step-2");
  /* nor inside a save in flight, nor around one */
  x_ok(x_call(c, "{\"op\":\"begin\",\"save\":\"fl\",\"dir\":\"mine/step-9\",\"rank\":0,\"world_size\":1}"), "begin");
  x_err(x_call(c, "{\"op\":\"begin\",\"save\":\"in\",\"dir\":\"mine/step-9/x\",\"rank\":0,\"world_size\":1}"),
        "conflict", "'mine/step-9/x' lies inside 'mine/step-9', the destination of save 'fl'", "inside a save in flight");
  x_err(x_call(c, "{\"op\":\"begin\",\"save\":\"out\",\"dir\":\"mine\",\"rank\":0,\"world_size\":1,\"overwrite\":true}"),
        "conflict", "holds 'mine/step-9'", "around a save in flight");
  x_ok(x_call(c, "{\"op\":\"abort\",\"save\":\"fl\"}"), "abort");
  /* A itself goes on saving, and its checkpoint loads */
  saved_as(TH_U_OTHER, TH_G_OTHER, "a2", "A/run/step-2", 2);
  h_verify_ok("A/run/step-1");
  h_verify_ok("A/run/step-2");
  const uint8_t one = 1;
  h_check_bytes("A/run/step-1", "w", &one, 1);
  /* a folder made by hand records nobody: open to every uid */
  cr_assert_eq(mkdir(h_path(p, sizeof p, "shared"), 0777), 0);
  saved_as(TH_U_THIRD, TH_G_OTHER, "sb", "shared/b", 2);
  saved_as(TH_U_OTHER, TH_G_OTHER, "sa", "shared/a", 1);
  x_close(c);
  x_serving();
}

Test(perms, trusted_group_members_may_save_under_another_uids_folder) {
  TH_NEED_ROOT("run clients as other uids");
  open_up();
  const char *flags[] = {"--socket-mode", "0666", "--trusted-group", "4242", NULL};
  x_start(flags);
  saved_as(TH_U_OTHER, TH_G_OTHER, "t1", "team/run/step-1", 1);
  refused_as(TH_U_THIRD, "team/run/step-2", 0, "only uid 4243 or members of trusted_group may");
  saved_as(TH_U_THIRD, TH_G_TRUST, "t2", "team/run/step-2", 2);
  /* but not inside a checkpoint */
  x_step s[4];
  char l[4][256];
  save_steps(s, l, "t3", "team/run/step-1/x", 0, 2);
  s[0].want = "\"code\":\"conflict\"";
  cr_assert_eq(x_steps_as(TH_U_THIRD, TH_G_TRUST, s, 1), 0, "a trusted member saved inside a checkpoint");
  h_verify_ok("team/run/step-2");
  x_serving();
}
