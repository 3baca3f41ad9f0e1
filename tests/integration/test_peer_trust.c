/* What a peer may not do: a local user without the token relaying a daemon's own handshake, a leader naming a checkpoint as its temporary folder, a node reporting other than it was assigned, one node filling the leader's room. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host_facts.h"
#include "peer_util.h"
#include "xclient.h"

static char token_path[PATH_MAX];

/* One daemon, node0, whose socket every local user may use; the token file is root's, mode 0600. */
static void setup(void) {
  pu_scratch("trust");
  snprintf(token_path, sizeof token_path, "%s/token", H.base);
  write_token(token_path, "the-cluster-secret-0123456789abcdef\n");
  static const char *const open_socket[] = {"--socket-mode", "0666", NULL};
  start_node_with(0, token_path, open_socket);
  snprintf(H.sock, sizeof H.sock, "%s", N[0].d.sock);
  snprintf(H.log, sizeof H.log, "%s", N[0].d.log);
  cr_assert_eq(chmod(H.base, 0755), 0, "chmod %s", H.base);
}

TestSuite(peer_trust, .init = setup, .fini = pu_teardown, .timeout = 120);

/* ------------------------------------------------------------------------ *
 * Raw frames without criterion (usable in a forked child) and a listener
 * ------------------------------------------------------------------------ */
static int raw_send(int fd, const char *json) {
  size_t n = strlen(json);
  uint8_t len[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
  return write(fd, len, 4) == 4 && write(fd, json, n) == (ssize_t)n ? 0 : -1;
}

static int read_full(int fd, void *buf, size_t n) {
  for (size_t got = 0; got < n;) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* The next frame's header (its payload, if any, skipped); NULL on close or after the socket's timeout. */
static json_t *raw_read(int fd) {
  uint8_t len[4];
  if (read_full(fd, len, 4) != 0) return NULL;
  size_t n = (size_t)len[0] << 24 | (size_t)len[1] << 16 | (size_t)len[2] << 8 | len[3];
  if (n > (16u << 20)) return NULL;
  char *buf = malloc(n);
  json_t *j = buf && read_full(fd, buf, n) == 0 ? json_loadb(buf, n, 0, NULL) : NULL;
  free(buf);
  json_int_t plen = json_integer_value(json_object_get(j, "len"));
  for (char skip[4096]; plen > 0; plen -= (json_int_t)sizeof skip)
    if (read_full(fd, skip, plen < (json_int_t)sizeof skip ? (size_t)plen : sizeof skip) != 0) break;
  return j;
}

static const char *jstr(json_t *j, const char *k) {
  const char *s = json_string_value(json_object_get(j, k));
  return s ? s : "";
}

/* A listener on 127.0.0.1, any port: *port gets it. */
static int listen_any(unsigned *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 8) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
    return -1;
  *port = ntohs(sa.sin_port);
  return fd;
}

/* The next connection within 10 s, its reads timing out after 10 s; -1 when none came. */
static int accept_one(int lfd) {
  struct pollfd p = {.fd = lfd, .events = POLLIN};
  if (poll(&p, 1, 10000) != 1) return -1;
  int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
  struct timeval tv = {10, 0};
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static int connect_to(const char *addr) {
  char host[64];
  int port;
  if (sscanf(addr, "%63[^:]:%d", host, &port) != 2) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? fd : -1;
}

/* ------------------------------------------------------------------------ *
 * 1. Reflection: another uid, which cannot read the token, begins a save
 * naming its own port as the leader, and relays the daemon's own hello and
 * proofs between the daemon's connection to it and its connection to the
 * daemon's peer port
 * ------------------------------------------------------------------------ */
/* The attacker, as uid TH_U_OTHER in a forked child: writes what happened on the daemon's own
 * listener into out (one line), returns 0 once it got that far. On c2 it calls itself `name`, or
 * relays the daemon's own name when name is NULL. */
static int reflect(FILE *out, const char *save, const char *name) {
  if (open(token_path, O_RDONLY) >= 0 || errno != EACCES) return 10; /* it must not hold the secret */
  unsigned port = 0;
  int lfd = listen_any(&port);
  if (lfd < 0) return 11;
  x_conn *rank = x_try_connect(H.sock);
  if (!rank) return 12;
  x_sendf(rank, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"refl/%s\",\"rank\":1,\"world_size\":2,\"nnodes\":2,"
                "\"node_rank\":1,\"leader\":\"127.0.0.1:%u\"}", save, save, port);
  char *r = x_read_line(rank, X_REPLY_MS);
  if (!r || !strstr(r, "\"ok\":true")) return 13;
  free(r);
  /* c1: the daemon dials its "leader"; c2: the attacker dials the daemon */
  int c1 = accept_one(lfd);
  json_t *h1 = c1 >= 0 ? raw_read(c1) : NULL;
  int c2 = connect_to(N[0].addr);
  if (!h1 || c2 < 0) return 14;
  json_int_t v = json_integer_value(json_object_get(h1, "v"));
  char m[1024];
  /* the daemon's own hello, relayed: its version, its nonce, and its name or another */
  snprintf(m, sizeof m, "{\"t\":\"hello\",\"v\":%lld,\"node\":\"%s\",\"nonce\":\"%s\",\"listen\":\"127.0.0.1:%u\"}",
           (long long)v, name ? name : jstr(h1, "node"), jstr(h1, "nonce"), port);
  raw_send(c2, m);
  json_t *h2 = raw_read(c2);
  if (h2 && !strcmp(jstr(h2, "t"), "hello")) {
    /* the daemon answered on c2 with a nonce of its own: relay it to c1 as the "leader's" */
    snprintf(m, sizeof m, "{\"t\":\"hello\",\"v\":%lld,\"node\":\"%s\",\"nonce\":\"%s\"}", (long long)v, jstr(h1, "node"),
             jstr(h2, "nonce"));
    raw_send(c1, m);
    json_t *p1 = raw_read(c1); /* the daemon's proof as the connector on c1 ... */
    if (p1 && !strcmp(jstr(p1, "t"), "auth")) {
      snprintf(m, sizeof m, "{\"t\":\"auth\",\"proof\":\"%s\"}", jstr(p1, "proof"));
      raw_send(c2, m); /* ... offered back to it as ours on c2 */
      json_decref(h2);
      h2 = raw_read(c2);
    }
    json_decref(p1);
  }
  fprintf(out, "%s %s %s\n", h2 ? jstr(h2, "t") : "closed", jstr(h2, "code"), jstr(h2, "message"));
  fflush(out);
  json_decref(h1);
  json_decref(h2);
  close(c1);
  close(c2);
  close(lfd);
  x_close(rank);
  return 0;
}

Test(peer_trust, a_local_user_without_the_token_cannot_reflect_the_daemons_handshake) {
  TH_NEED_ROOT("run the attacker as another uid");
  int pfd[2];
  cr_assert_eq(pipe(pfd), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    if (setgroups(0, NULL) != 0 || setgid(TH_G_OTHER) != 0 || setuid(TH_U_OTHER) != 0) _exit(100);
    FILE *out = fdopen(pfd[1], "w");
    if (!out) _exit(101);
    int rc = reflect(out, "refl-own-name", NULL);
    if (rc == 0) rc = reflect(out, "refl-other-name", "mallory");
    fclose(out);
    _exit(rc);
  }
  close(pfd[1]);
  char got[2][1024] = {"", ""};
  FILE *in = fdopen(pfd[0], "r");
  for (int i = 0; i < 2; i++)
    if (!fgets(got[i], sizeof got[i], in)) got[i][0] = '\0';
  fclose(in);
  int st = 0;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the attacker could not run the attack (status 0x%x)", st);
  for (int i = 0; i < 2; i++) {
    printf("peer_trust reflection (%s name): the daemon answered the relayed handshake with: %s",
           i ? "another" : "the daemon's own", got[i]);
    cr_assert(strncmp(got[i], "auth", 4) != 0, "the daemon logged in a peer that holds no token: %s", got[i]);
    cr_assert(strstr(got[i], "error permission_denied"), "the relay must be refused as permission_denied: %s", got[i]);
  }
  fflush(stdout);
  /* nobody logged in on the daemon's listener, and its save with that "leader" failed */
  json_t *st1 = node_status(0);
  cr_assert_eq(json_integer_value(json_object_get(json_object_get(st1, "peers"), "connections")), 0,
               "an authenticated connection is left: %s", json_dumps(st1, 0));
  json_decref(st1);
  cr_assert(!log_has(0, "authenticated (it connected)"), "the daemon authenticated the relay");
  h_expect_unpublished("refl/refl-own-name");
  h_expect_unpublished("refl/refl-other-name");
}

/* ------------------------------------------------------------------------ *
 * A stand-in leader (it holds the token): a rank of node0 begins a two-node
 * save whose leader is the test's port
 * ------------------------------------------------------------------------ */
typedef struct {
  x_conn *rank;            /* the rank on node0 (node_rank 1) */
  int lfd, fd;             /* the test's listener, and node0's connection to it */
  char tok[17];            /* from its join */
  json_t *manifest;
} fake_lead;

/* A committed one-node checkpoint at dir, holding w = {1..8} (U8). */
static void commit_one(const char *save, const char *dir) {
  x_conn *c = x_connect();
  char line[512];
  snprintf(line, sizeof line, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":0,\"world_size\":1}", save, dir);
  x_ok(x_call(c, line), "begin");
  snprintf(line, sizeof line, "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[8],"
                              "\"data\":\"AQIDBAUGBwg=\"}", save);
  x_ok(x_call(c, line), "put");
  snprintf(line, sizeof line, "{\"op\":\"seal\",\"save\":\"%s\"}", save);
  x_ok(x_call(c, line), "seal");
  snprintf(line, sizeof line, "{\"op\":\"wait\",\"save\":\"%s\"}", save);
  json_t *r = x_call(c, line);
  cr_assert(json_is_true(json_object_get(r, "ok")), "%s", json_dumps(r, 0));
  json_decref(r);
  x_close(c);
}

/* node0's rank 1 puts row 1 of w (U8 [2,4]) and seals; the test logs in as the leader and reads
 * the join and the manifest. */
static void lead_fake(fake_lead *F, const char *save, const char *dir) {
  unsigned port = 0;
  F->lfd = listen_any(&port);
  cr_assert_geq(F->lfd, 0);
  F->rank = x_connect();
  char line[512];
  snprintf(line, sizeof line, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"%s\",\"rank\":1,\"world_size\":2,\"nnodes\":2,"
                              "\"node_rank\":1,\"leader\":\"127.0.0.1:%u\",\"write_mode\":\"shared\"}", save, dir, port);
  x_ok(x_call(F->rank, line), "begin");
  snprintf(line, sizeof line, "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"w\",\"dtype\":\"U8\",\"shape\":[2,4],"
                              "\"start\":[1,0],\"count\":[1,4],\"data\":\"BQYHCA==\"}", save);
  x_ok(x_call(F->rank, line), "put");
  snprintf(line, sizeof line, "{\"op\":\"seal\",\"save\":\"%s\"}", save);
  x_ok(x_call(F->rank, line), "seal");
  F->fd = accept_one(F->lfd);
  cr_assert_geq(F->fd, 0, "node0 never dialled its leader");
  peer_accept_login(F->fd, token_path, "fakelead");
  F->manifest = NULL;
  for (json_t *m; !F->manifest && (m = raw_read(F->fd));) {
    if (!strcmp(jstr(m, "t"), "join")) snprintf(F->tok, sizeof F->tok, "%s", jstr(m, "tok"));
    if (!strcmp(jstr(m, "t"), "manifest")) F->manifest = m;
    else json_decref(m);
  }
  cr_assert_not_null(F->manifest, "no manifest from node0");
}

/* The assignment a leader would send, but with tmp and the one file's name as given. */
static void assign(fake_lead *F, const char *save, const char *tmp, const char *file) {
  json_t *sl = json_array_get(json_array_get(json_object_get(F->manifest, "boxes"), 0), 1);
  char m[1024];
  snprintf(m, sizeof m,
           "{\"t\":\"assign\",\"save\":\"%s\",\"tok\":\"%s\",\"cid\":\"0123456789abcdef\",\"tmp\":\"%s\",\"nfiles\":1,"
           "\"write_mode\":\"shared\",\"files\":[{\"f\":0,\"name\":\"%s\",\"size\":88,\"hdr\":0,\"data\":4}],"
           "\"writes\":[[%lld,0,0,1,4]],\"peers\":{}}",
           save, F->tok, tmp, file, (long long)json_integer_value(sl));
  raw_send(F->fd, m);
}

static void fake_done(fake_lead *F) {
  json_decref(F->manifest);
  close(F->fd);
  close(F->lfd);
  x_close(F->rank);
}

/* A leader (one that holds the token) names as the temporary folder a committed checkpoint beside
 * the save's dir: to write into (the files it names exist), or to remove (it names a missing file,
 * then goes away, so node0 cleans up the folder). node0 refuses both, and the checkpoint is intact. */
Test(peer_trust, an_assignment_naming_a_checkpoint_as_its_folder_is_refused) {
  commit_one("keep", "ck/keep");
  char keep[PATH_MAX];
  uint64_t before = x_tree_hash(h_path(keep, sizeof keep, "ck/keep"));
  static const struct {
    const char *save, *file, *how;
  } cases[] = {{"overwrite", "model.safetensors", "write into"}, {"delete", "missing.safetensors", "remove"}};
  for (size_t i = 0; i < 2; i++) {
    fake_lead F;
    char dir[64];
    snprintf(dir, sizeof dir, "ck/%s", cases[i].save);
    lead_fake(&F, cases[i].save, dir);
    assign(&F, cases[i].save, "keep", cases[i].file);
    json_t *m = raw_read(F.fd); /* node0 fails the save and tells its leader why */
    const char *why = json_string_value(json_object_get(m, "message"));
    printf("peer_trust tmp (%s): node0 answered %s: %s\n", cases[i].how, jstr(m, "t"), why ? why : "");
    fflush(stdout);
    cr_assert(why && strstr(why, "the assignment's temporary folder 'keep' is not one of this save's (leader 'fakelead')"),
              "node0 took 'keep' as the temporary folder to %s: %s", cases[i].how, why ? why : "(nothing)");
    json_decref(m);
    fake_done(&F);
    h_await_no_tmp();
    cr_assert_eq(x_tree_hash(keep), before, "the checkpoint changed (%s)", cases[i].how);
    h_verify_ok("ck/keep");
  }
}

/* ------------------------------------------------------------------------ *
 * A node (it holds the token) standing in for node 1 of a save node0 leads
 * ------------------------------------------------------------------------ */
/* node0's rank 0 puts a (U8 [8]); the fake node 1 joins with rank 1 holding b and c (U8 [8] each),
 * 8-byte shards so each tensor has its own file, and returns the leader's assignment to it. */
static json_t *join_as_node1_padded(int fd, x_conn *rank, const char *save, size_t pad);
static json_t *join_as_node1(int fd, x_conn *rank, const char *save) { return join_as_node1_padded(fd, rank, save, 0); }

/* The same, the manifest carrying a field "pad" of that many zeros (a field the leader ignores): a
 * frame of its kind's legitimate size that takes a while to parse. */
static json_t *join_as_node1_padded(int fd, x_conn *rank, const char *save, size_t pad) {
  char line[1024];
  snprintf(line, sizeof line, "{\"op\":\"begin\",\"save\":\"%s\",\"dir\":\"trust/%s\",\"rank\":0,\"world_size\":2,"
                              "\"nnodes\":2,\"node_rank\":0,\"leader\":\"%s\",\"max_shard_size\":8}", save, save, N[0].addr);
  x_ok(x_call(rank, line), "begin");
  snprintf(line, sizeof line, "{\"op\":\"put\",\"save\":\"%s\",\"name\":\"a\",\"dtype\":\"U8\",\"shape\":[8],"
                              "\"data\":\"AQIDBAUGBwg=\"}", save);
  x_ok(x_call(rank, line), "put");
  snprintf(line, sizeof line, "{\"op\":\"seal\",\"save\":\"%s\"}", save);
  x_ok(x_call(rank, line), "seal");
  const char *tok = "0123456789abcdef";
  snprintf(line, sizeof line,
           "{\"t\":\"join\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"nnodes\":2,\"world_size\":2,\"dir\":\"trust/%s\","
           "\"prefix\":\"model\",\"max_shard_size\":8,\"overwrite\":false,\"write_mode\":\"owner\",\"metadata\":{},"
           "\"leader\":\"%s\",\"join_timeout\":30}", save, tok, save, N[0].addr);
  send_frame(fd, line);
  snprintf(line, sizeof line, "{\"t\":\"began\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"rank\":1}", save, tok);
  send_frame(fd, line);
  /* its table (b and c, declared by rank 1) and a box of each, whole (PEERS.md, manifest) */
  static const char table[] = "[[\"b\",\"U8\",[8],-1,1],[\"c\",\"U8\",[8],-1,1]]";
  char hex[65];
  table_digest(table, hex);
  snprintf(line, sizeof line,
           "{\"t\":\"manifest\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"ranks\":[1],\"table\":{\"n\":2,"
           "\"digest\":\"%s\"},\"boxes\":[[0,0,1,0,8],[1,1,1,0,8]],\"files\":[]%s", save, tok, hex,
           pad ? ",\"pad\":[" : "}");
  size_t at = strlen(line);
  char *big = malloc(at + 2 * pad + 3);
  cr_assert_not_null(big);
  memcpy(big, line, at);
  for (size_t i = 0; i < pad; i++) {
    big[at++] = '0';
    big[at++] = i + 1 < pad ? ',' : ']';
  }
  if (pad) big[at++] = '}';
  big[at] = '\0';
  raw_send(fd, big);
  free(big);
  for (json_t *a; (a = raw_read(fd));) {
    if (!strcmp(jstr(a, "t"), "assign") && !strcmp(jstr(a, "save"), save)) return a;
    if (!strcmp(jstr(a, "t"), "send_table")) send_table(fd, save, tok, table);
    json_decref(a);
  }
  cr_assert_fail("no assignment for the fake node in save '%s'", save);
  return NULL;
}

/* What node 1 reports instead of its files: one entry of another node's, one of its own twice, a
 * null file. Each time node0 fails the save as a protocol error naming node 1 and what it said. */
Test(peer_trust, a_done_that_differs_from_the_assignment_fails_the_save_naming_the_node) {
  int fd = tcp_connect(N[0].addr);
  peer_login(fd, token_path, "fake1");
  x_conn *rank = x_connect();
  static const struct {
    const char *save, *want;
  } cases[] = {{"other", "which was not assigned to it"}, {"twice", "twice"}, {"null", "a malformed file entry"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *a = join_as_node1(fd, rank, cases[i].save);
    json_t *files = json_object_get(a, "files");
    cr_assert_eq(json_array_size(files), 2, "node 1 writes the files of b and c: %s", json_dumps(a, 0));
    json_int_t own[2], mine = 0;
    for (int k = 0; k < 2; k++) {
      json_t *f = json_array_get(files, (size_t)k);
      own[k] = json_integer_value(json_object_get(f, "f"));
      cr_assert_eq(json_integer_value(json_object_get(f, "hdr")) + json_integer_value(json_object_get(f, "data")),
                   json_integer_value(json_object_get(f, "size")), "node 1 writes all of its files");
      mine = json_integer_value(json_object_get(f, "size"));
    }
    json_int_t other = 3 - own[0] - own[1]; /* files 0, 1, 2: node0 writes the third */
    char entries[128], m[512];
    if (!strcmp(cases[i].save, "other"))
      snprintf(entries, sizeof entries, "[%lld,0],[%lld,%lld]", (long long)other, (long long)own[1], (long long)mine);
    else if (!strcmp(cases[i].save, "twice"))
      snprintf(entries, sizeof entries, "[%lld,%lld],[%lld,%lld]", (long long)own[0], (long long)mine, (long long)own[0],
               (long long)mine);
    else
      snprintf(entries, sizeof entries, "[null,0],[%lld,%lld]", (long long)own[1], (long long)mine);
    snprintf(m, sizeof m,
             "{\"t\":\"done\",\"save\":\"%s\",\"node\":1,\"tok\":\"0123456789abcdef\",\"cid\":\"%s\",\"files\":[%s]}",
             cases[i].save, jstr(a, "cid"), entries);
    json_decref(a);
    send_frame(fd, m);
    char line[128];
    snprintf(line, sizeof line, "{\"op\":\"wait\",\"save\":\"%s\"}", cases[i].save);
    json_t *r = x_call(rank, line);
    const char *msg = jstr(json_object_get(r, "error"), "message");
    char *shown = json_dumps(r, JSON_COMPACT);
    printf("peer_trust done (%s): rank 0's wait: %s\n", cases[i].save, shown);
    free(shown);
    fflush(stdout);
    /* the leader fails it as a protocol error; its own ranks did nothing wrong: internal, with the reason */
    cr_assert_str_eq(jstr(json_object_get(r, "error"), "code"), "internal", "%s", json_dumps(r, 0));
    cr_assert(strstr(msg, "node 1 ('fake1', 127.0.0.1:1) reported") && strstr(msg, cases[i].want), "%s", msg);
    cr_assert_eq(f_log_count(N[0].d.log, "failed (protocol_error)"), (int)i + 1, "the leader's log");
    json_decref(r);
    char dir[64];
    snprintf(dir, sizeof dir, "trust/%s", cases[i].save);
    h_await_no_tmp();
    h_expect_unpublished(dir);
  }
  x_close(rank);
  close(fd);
}

/* ------------------------------------------------------------------------ *
 * 7c. One node's joins that the leader's own ranks never follow
 * ------------------------------------------------------------------------ */
Test(peer_trust, one_node_cannot_fill_the_leaders_room_with_ghost_joins) {
  h_daemon_stop(&N[0].d);
  static const char *const flags[] = {"--socket-mode", "0666", "--max-leader-saves", "8", NULL};
  start_node_with(0, token_path, flags);
  int fd = tcp_connect(N[0].addr);
  peer_login(fd, token_path, "ghost");
  char m[512];
  for (int i = 0; i < 8; i++) {
    snprintf(m, sizeof m,
             "{\"t\":\"join\",\"save\":\"ghost-%d\",\"node\":1,\"tok\":\"0123456789abcdef\",\"nnodes\":2,\"world_size\":2,"
             "\"dir\":\"g/%d\",\"prefix\":\"model\",\"max_shard_size\":8,\"overwrite\":false,\"write_mode\":\"owner\","
             "\"metadata\":{},\"leader\":\"%s\",\"join_timeout\":300}", i, i, N[0].addr);
    send_frame(fd, m);
  }
  /* the ghost's share: half the room; the rest of its joins are aborted */
  struct timeval tv = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int refused = 0;
  for (json_t *a; (a = raw_read(fd)); json_decref(a))
    if (!strcmp(jstr(a, "t"), "abort") && !strcmp(jstr(a, "code"), "limit_exceeded")) {
      if (!refused++) printf("peer_trust ghost joins: the leader answered: %s\n", jstr(a, "message"));
      cr_assert(strstr(jstr(a, "message"), "node 'ghost' already began 4 multi-node saves this daemon leads that its "
                                             "own ranks have not joined (at most 4, half of max_leader_saves=8)"),
                "%s", jstr(a, "message"));
    }
  printf("peer_trust ghost joins: %d of 8 refused\n", refused);
  fflush(stdout);
  cr_assert_eq(refused, 4, "the ghost began %d saves of the 8 the leader has room for", 8 - refused);
  /* a real save still gets its leader state */
  x_conn *rank = x_connect();
  x_ok(x_callf(rank, "{\"op\":\"begin\",\"save\":\"real\",\"dir\":\"g/real\",\"rank\":0,\"world_size\":2,\"nnodes\":2,"
                     "\"node_rank\":0,\"leader\":\"%s\"}", N[0].addr), "begin");
  int found = 0;
  for (int64_t until = f_now_ms() + F_WAIT_MS; !found && f_now_ms() < until;) {
    json_t *st = node_status(0);
    json_t *ls = json_object_get(json_object_get(st, "peers"), "leader_saves");
    for (size_t i = 0; i < json_array_size(ls); i++)
      found |= !strcmp(jstr(json_array_get(ls, i), "save"), "real") &&
               !strcmp(jstr(json_array_get(ls, i), "state"), "collecting");
    json_decref(st);
    if (!found) sleep_ms(20);
  }
  cr_assert(found, "the real save has no leader state beside the ghost's");
  cr_assert(!log_has(0, "save 'real': refusing"), "the real save was refused");
  x_close(rank);
  close(fd);
}

/* ------------------------------------------------------------------------ *
 * 6. Frames: each kind up to its legitimate size, refused unread past it;
 * a large legitimate one parsed off the loop
 * ------------------------------------------------------------------------ */
/* The most a status call took until then (seconds on now_s's clock), in ms. */
static double worst_status_ms(double until_s) {
  double worst = 0;
  while (now_s() < until_s) {
    double t0 = now_s();
    json_decref(node_status(0));
    double ms = (now_s() - t0) * 1000;
    if (ms > worst) worst = ms;
  }
  return worst;
}

/* The next frame that is not a heartbeat; NULL on close or timeout. */
static json_t *read_not_ping(int fd) {
  json_t *e = raw_read(fd);
  while (e && !strcmp(jstr(e, "t"), "ping")) {
    json_decref(e);
    e = raw_read(fd);
  }
  return e;
}

/* A frame claiming `claimed` bytes of header of which only head goes out (its length and kind
 * first); the daemon's answer, which must come before the rest would. */
static json_t *claim_frame(int fd, uint32_t claimed, const char *head) {
  uint8_t len[4] = {(uint8_t)(claimed >> 24), (uint8_t)(claimed >> 16), (uint8_t)(claimed >> 8), (uint8_t)claimed};
  cr_assert_eq(write(fd, len, 4), 4);
  cr_assert_eq(write(fd, head, strlen(head)), (ssize_t)strlen(head));
  return read_not_ping(fd);
}

/* The same, from 'fake1' logged in to node0: refused with limit_exceeded before the rest is
 * buffered, the message holding want and naming the node, the connection closed. */
static void expect_refused_unread(int fd, uint32_t claimed, const char *head, const char *what, const char *want) {
  long rss0 = x_rss_kib(N[0].d.pid);
  json_t *e = claim_frame(fd, claimed, head);
  cr_assert_not_null(e, "no answer to a %s before its bytes came: the leader is buffering it", what);
  printf("peer_trust frames: a %s: the leader answered %s %s: %s (RSS %ld KiB before, %ld after)\n", what,
         jstr(e, "t"), jstr(e, "code"), jstr(e, "message"), rss0, x_rss_kib(N[0].d.pid));
  fflush(stdout);
  cr_assert_str_eq(jstr(e, "code"), "limit_exceeded");
  cr_assert(strstr(jstr(e, "message"), want), "%s", jstr(e, "message"));
  cr_assert(strstr(jstr(e, "message"), "'fake1'"), "the refusal does not name the node: %s", jstr(e, "message"));
  json_decref(e);
  cr_assert_null(raw_read(fd), "the connection must be closed");
}

Test(peer_trust, a_done_past_its_plans_size_is_refused_unread) {
  int fd = tcp_connect(N[0].addr);
  peer_login(fd, token_path, "fake1");
  x_conn *rank = x_connect();
  json_t *a = join_as_node1(fd, rank, "bigdone");
  json_decref(a);
  /* a done of 4M checksum shares claims 68 MB: only its length and kind go out first */
  const char *head = "{\"t\":\"done\",\"save\":\"bigdone\",\"node\":1,\"tok\":\"0123456789abcdef\",\"sums\":[";
  expect_refused_unread(fd, 68000000, head, "68 MB done",
                        "peer frame 'done' of 68000000 bytes is over the limit of 4224 for its kind");
  close(fd);
  json_t *r = x_callf(rank, "{\"op\":\"wait\",\"save\":\"bigdone\"}");
  cr_assert_str_eq(jstr(json_object_get(r, "error"), "code"), "limit_exceeded", "%s", json_dumps(r, 0));
  cr_assert(strstr(jstr(json_object_get(r, "error"), "message"), "node 1 (127.0.0.1:1)"), "rank 0 hears which node");
  json_decref(r);
  x_close(rank);
  h_await_no_tmp();
  h_expect_unpublished("trust/bigdone");
}

/* A join is a handful of fields and the save's metadata, which came in a begin line and must equal
 * what the leader's own ranks give in lines of at most max_line (16 MiB): past 64 KiB + 16 MiB it is
 * refused after its length and kind, naming both and the node. Before: joins of up to 600 MB
 * (6 x max_header) were buffered. */
Test(peer_trust, a_join_past_its_kinds_size_is_refused_unread) {
  int fd = tcp_connect(N[0].addr);
  peer_login(fd, token_path, "fake1");
  const char *head = "{\"t\":\"join\",\"save\":\"bigjoin\",\"node\":1,\"tok\":\"0123456789abcdef\",\"metadata\":{\"x\":\"";
  expect_refused_unread(fd, 32u << 20, head, "32 MiB join",
                        "peer frame 'join' of 33554432 bytes is over the limit of 16842752 for its kind");
  close(fd);
  h_expect_serving();
}

/* A node gets headers only for files where it holds bytes (one per tensor it holds, + 1 of no bytes),
 * each at most max_header (100 MB): node0 holds one tensor, so an assignment carrying 300 MB of
 * headers is refused before its payload is buffered, naming the kind and the leader, and the save
 * fails there. Before: up to 1 GiB was taken (18 files x max_header). */
Test(peer_trust, an_assignment_past_what_the_node_holds_is_refused_unread) {
  fake_lead F;
  lead_fake(&F, "bigassign", "ck/bigassign");
  long rss0 = x_rss_kib(N[0].d.pid);
  char m[1024];
  snprintf(m, sizeof m,
           "{\"t\":\"assign\",\"save\":\"bigassign\",\"tok\":\"%s\",\"cid\":\"0123456789abcdef\",\"tmp\":\"x\","
           "\"nfiles\":1,\"write_mode\":\"shared\",\"files\":[{\"f\":0,\"name\":\"model.safetensors\",\"size\":300000004,"
           "\"hdr\":300000000,\"data\":4}],\"writes\":[],\"peers\":{},\"len\":300000000}", F.tok);
  raw_send(F.fd, m);
  json_t *e = read_not_ping(F.fd);
  cr_assert_not_null(e, "no answer to 300 MB of headers before they came: node0 is buffering them");
  printf("peer_trust frames: an assignment with 300 MB of headers: node0 answered %s %s: %s (RSS %ld KiB before, %ld "
         "after)\n", jstr(e, "t"), jstr(e, "code"), jstr(e, "message"), rss0, x_rss_kib(N[0].d.pid));
  fflush(stdout);
  cr_assert_str_eq(jstr(e, "code"), "limit_exceeded");
  cr_assert(strstr(jstr(e, "message"), "peer frame 'assign' with a payload of 300000000 bytes is over the limit of "
                                       "200000000 for its kind"), "%s", jstr(e, "message"));
  cr_assert(strstr(jstr(e, "message"), "'fakelead'"), "the refusal does not name the leader: %s", jstr(e, "message"));
  json_decref(e);
  char line[128];
  snprintf(line, sizeof line, "{\"op\":\"wait\",\"save\":\"bigassign\"}");
  json_t *r = x_call(F.rank, line);
  const char *why = jstr(json_object_get(r, "error"), "message");
  printf("peer_trust frames: node0's rank heard: %s\n", why ? why : "(nothing)");
  cr_assert_str_eq(jstr(json_object_get(r, "error"), "code"), "limit_exceeded", "%s", json_dumps(r, 0));
  cr_assert(why && strstr(why, "'assign'"), "the rank does not hear which frame: %s", why ? why : "");
  json_decref(r);
  fake_done(&F);
  h_expect_unpublished("ck/bigassign");
}

/* A manifest of 24 MB (a field of 12M zeros the leader ignores) is within its kind's size: the
 * leader parses it in the thread pool, answers status meanwhile, and plans the save. */
Test(peer_trust, a_large_legitimate_frame_is_parsed_off_the_loop) {
  int fd = tcp_connect(N[0].addr);
  peer_login(fd, token_path, "fake1");
  x_conn *rank = x_connect();
  double t0 = now_s();
  json_t *a = join_as_node1_padded(fd, rank, "bigman", 12u << 20);
  double took = now_s() - t0;
  cr_assert_eq(json_array_size(json_object_get(a, "files")), 2, "the save was planned");
  json_decref(a);
  /* the same again, with status calls while it is parsed */
  x_ok(x_callf(rank, "{\"op\":\"abort\",\"save\":\"bigman\"}"), "abort");
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    double worst = worst_status_ms(now_s() + took + 1.0);
    printf("peer_trust frames: a 24 MB manifest (%.2f s from join to assignment): the worst status call beside it "
           "took %.1f ms\n", took, worst);
    fflush(stdout);
    _exit(0);
  }
  a = join_as_node1_padded(fd, rank, "bigman2", 12u << 20);
  json_decref(a);
  cr_assert_eq(f_reap(pid, 60000), 0);
  x_close(rank);
  close(fd);
}
