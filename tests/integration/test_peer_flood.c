/* Hostile clients of the peer port (issue 16): idle and slow connection floods, leader state limits, escaped logs. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "peer_util.h"

#define NONCE "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
/* Strangers come from another loopback address than the real daemons (127.0.0.1). */
#define STRANGER "127.0.0.2"

static char token_path[PATH_MAX];

static void setup(void) {
  pu_scratch("flood");
  snprintf(token_path, sizeof token_path, "%s/token", H.base);
  write_token(token_path, "the-cluster-secret-0123456789abcdef\n");
  for (int r = 0; r < H_MAX_RANKS; r++) rank_node[r] = r;
  /* Floods of a thousand connections need descriptors: the test's, and the daemons' it forks. */
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  rl.rlim_cur = rl.rlim_max;
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  cr_assert_geq(rl.rlim_cur, 2400, "the hard RLIMIT_NOFILE (%llu) is too low for these tests",
                (unsigned long long)rl.rlim_cur);
}

static void teardown(void) { pu_teardown(); }

TestSuite(peer_flood, .init = setup, .fini = teardown, .timeout = 60);

/* A connection to addr from the address src, or -1 when the connect fails. */
static int connect_from(const char *src, const char *addr) {
  char host[64];
  int port;
  cr_assert_eq(sscanf(addr, "%63[^:]:%d", host, &port), 2);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert(fd >= 0, "socket: %s", strerror(errno));
  struct sockaddr_in me = {.sin_family = AF_INET};
  inet_pton(AF_INET, src, &me.sin_addr);
  cr_assert_eq(bind(fd, (struct sockaddr *)&me, sizeof me), 0, "bind %s: %s", src, strerror(errno));
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static json_t *peers_status(int i) {
  json_t *st = node_status(i);
  json_t *p = json_incref(json_object_get(st, "peers"));
  json_decref(st);
  cr_assert_not_null(p, "status of node %d has no peers object", i);
  return p;
}

static long long peers_field(int i, const char *field) {
  json_t *p = peers_status(i);
  json_t *v = json_object_get(p, field);
  cr_assert(json_is_integer(v), "status peers.%s missing", field);
  long long n = json_integer_value(v);
  json_decref(p);
  return n;
}

static void expect_alive(int i) {
  int st;
  cr_assert_neq(waitpid(N[i].d.pid, &st, WNOHANG), N[i].d.pid, "node %d died; see %s", i, N[i].d.log);
}

static int log_count(int i, const char *needle) {
  char *log = h_slurp(N[i].d.log, NULL);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
  free(log);
  return n;
}

/* ------------------------------------------------------------------------ *
 * Idle connections
 * ------------------------------------------------------------------------ */
#define IDLE 1100

/* 1,100 connections that send nothing: over the cap on strangers, the busiest source's oldest
 * goes (no crash on refusal, rate-limited lines); with a cap above the flood every one is held.
 * Either way the daemon lives and answers. */
Test(peer_flood, a_thousand_idle_connections_leave_the_daemon_serving) {
  static int fds[IDLE];
  start_node(0, token_path);
  for (int k = 0; k < IDLE; k++) {
    fds[k] = connect_from(STRANGER, N[0].addr);
    cr_assert(fds[k] >= 0, "connection %d: %s", k, strerror(errno));
  }
  /* Let the daemon accept the backlog, then it must answer. */
  F_POLL(peers_field(0, "connections") <= 64);
  expect_alive(0);
  long long unauth = peers_field(0, "connections_unauthenticated");
  cr_assert_leq(unauth, 64, "%lld connections that never logged in are held (peer_max_unauth is 64)", unauth);
  cr_assert_gt(unauth, 0);
  int made_room = log_count(0, "closed to make room");
  cr_assert_geq(made_room, 1, "evictions are logged");
  cr_assert_leq(made_room, 10, "%d lines for %d evictions: refusals must be rate limited", made_room, IDLE - 64);
  for (int k = 0; k < IDLE; k++) close(fds[k]);

  /* A second daemon holds all of them, and still answers. */
  const char *roomy[] = {"--peer-max-unauth", "2000", "--peer-handshake-timeout", "30", "--peer-timeout", "30", NULL};
  start_node_with(1, token_path, roomy);
  for (int k = 0; k < IDLE; k++) {
    fds[k] = connect_from(STRANGER, N[1].addr);
    cr_assert(fds[k] >= 0, "connection %d: %s", k, strerror(errno));
  }
  F_POLL(peers_field(1, "connections_unauthenticated") >= IDLE);
  cr_assert_eq(peers_field(1, "connections_unauthenticated"), IDLE);
  expect_alive(1);
  for (int k = 0; k < IDLE; k++) close(fds[k]);
  F_POLL(peers_field(1, "connections") == 0);
  cr_assert_eq(peers_field(1, "connections"), 0, "closed connections are released");
  expect_alive(0);
  expect_alive(1);
}

/* Under a 1,024 descriptor limit, with the cap on strangers above the flood, the peer listener
 * refuses what would eat into fd_reserve (logged at a bounded rate) instead of taking the last
 * descriptors: the Unix socket keeps answering and the daemon lives. */
Test(peer_flood, idle_peer_connections_never_take_the_descriptor_reserve) {
  static int fds[IDLE];
  const char *roomy[] = {"--peer-max-unauth", "2000", "--peer-handshake-timeout", "30", "--peer-timeout", "30", NULL};
  start_node_with(0, token_path, roomy);
  struct rlimit low = {1024, 1024};
  cr_assert_eq(prlimit(N[0].d.pid, RLIMIT_NOFILE, &low, NULL), 0, "prlimit: %s", strerror(errno));
  for (int k = 0; k < IDLE; k++) {
    fds[k] = connect_from(STRANGER, N[0].addr);
    cr_assert(fds[k] >= 0, "connection %d: %s", k, strerror(errno));
  }
  F_POLL(log_count(0, "too many open descriptors") > 0);
  expect_alive(0);
  long long unauth = peers_field(0, "connections_unauthenticated");
  cr_assert_leq(unauth, 1024 - 2 * 64, "%lld strangers held under a 1,024 descriptor limit (peers leave 2 x fd_reserve)",
                unauth);
  cr_assert_gt(unauth, 0);
  int refused = log_count(0, "too many open descriptors");
  cr_assert_geq(refused, 1, "refusals past the descriptor budget are logged");
  cr_assert_leq(refused, 10, "%d lines: refusals must be rate limited", refused);
  for (int k = 0; k < IDLE; k++) close(fds[k]);
  F_POLL(peers_field(0, "connections") == 0);
  cr_assert_eq(peers_field(0, "connections"), 0, "closed connections are released");
  expect_alive(0);
}

/* ------------------------------------------------------------------------ *
 * Slow handshakes
 * ------------------------------------------------------------------------ */
typedef struct {
  int closed;
  double min_life, max_life;  /* seconds from connect to the daemon's close */
} trickle_stats;

/* n connections from STRANGER, each sending one byte of a hello frame every 250 ms (never a
 * whole frame), for ms; a connection the daemon closes is counted and, with reconnect, opened
 * again at once (without, the trickle ends early once the daemon closed all n). */
static trickle_stats trickle(const char *addr, int n, int ms, int reconnect) {
  static const char frame[] = "\0\0\0\310{\"t\":\"hello\",\"v\":3,\"node\":\"slow\",\"nonce\":\"" NONCE "\"}";
  struct pollfd pfd[400];
  double born[400], next[400];
  size_t at[400];
  cr_assert_leq(n, 400);
  trickle_stats st = {0, 1e9, 0};
  double t0 = now_s();
  for (int k = 0; k < n; k++) {
    pfd[k] = (struct pollfd){.fd = connect_from(STRANGER, addr), .events = POLLIN};
    born[k] = next[k] = now_s();
    at[k] = 0;
  }
  while (now_s() - t0 < ms / 1000.0 && (reconnect || st.closed < n)) {
    poll(pfd, (nfds_t)n, 20);
    double now = now_s();
    for (int k = 0; k < n; k++) {
      char buf[4096];
      int gone = pfd[k].fd < 0;
      if (!gone && (pfd[k].revents & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t r = recv(pfd[k].fd, buf, sizeof buf, MSG_DONTWAIT);
        gone = r == 0 || (r < 0 && errno != EAGAIN);
      }
      if (!gone && now >= next[k]) {
        gone = send(pfd[k].fd, frame + at[k]++ % (sizeof frame - 1), 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
               errno != EAGAIN;
        next[k] = now + 0.25;
      }
      if (!gone) continue;
      if (pfd[k].fd >= 0) {
        double life = now - born[k];
        st.closed++;
        if (life < st.min_life) st.min_life = life;
        if (life > st.max_life) st.max_life = life;
        close(pfd[k].fd);
        pfd[k].fd = -1;
      }
      if (reconnect) {
        pfd[k].fd = connect_from(STRANGER, addr);
        born[k] = next[k] = now;
        at[k] = 0;
      }
    }
  }
  for (int k = 0; k < n; k++)
    if (pfd[k].fd >= 0) close(pfd[k].fd);
  return st;
}

/* Connections trickling a half hello (never silent, so peer_timeout alone would keep them) are
 * closed by peer_handshake_timeout; under a reconnecting flood of them, over peer_max_unauth,
 * a real daemon with the token still logs in and a 2-node save commits. */
Test(peer_flood, slow_handshakes_meet_the_deadline_and_a_real_peer_still_joins) {
  /* A peer timeout far past the deadline tells which of the two closed them, however late a busy
   * machine runs either. */
  const char *strict[] = {"--peer-handshake-timeout", "1", "--peer-max-unauth", "32", "--peer-timeout", "30", NULL};
  start_node_with(0, token_path, strict);
  start_node(1, token_path);

  /* Below the cap: only the deadline closes them, long before the 30 s peer timeout. */
  trickle_stats a = trickle(N[0].addr, 20, F_WAIT_MS, 0);
  cr_assert_eq(a.closed, 20, "%d of 20 slow handshakes were closed", a.closed);
  cr_assert_geq(a.min_life, 0.9, "a slow handshake was closed after %.2f s, before the 1 s deadline", a.min_life);
  cr_assert_lt(a.max_life, 10, "a slow handshake lived %.2f s (deadline 1 s, peer timeout 30 s)", a.max_life);
  cr_assert(log_has(0, "peer_handshake_timeout"));

  /* Above it, reconnecting: 300 strangers churn through 32 slots while the save runs. */
  fflush(NULL);
  pid_t flood = fork();
  cr_assert(flood >= 0);
  if (flood == 0) {
    /* It churns until the save is checked and the test kills it, however long a busy machine takes. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    trickle(N[0].addr, 300, 10 * F_WAIT_MS, 1);
    _exit(0);
  }
  h_track_pid(flood);
  /* The save starts once the flood churns: more connections accepted than it holds sockets, and
   * one eviction logged (lines about strangers are rate-limited: the deadline's may hold it back). */
  const char *accepted = "peer connection from " STRANGER ":";
  F_POLL(log_count(0, accepted) >= 20 + 400 && log_has(0, "peer_max_unauth"));
  cr_assert_geq(log_count(0, accepted), 20 + 400, "the flood does not churn");
  cr_assert(log_has(0, "peer_max_unauth"), "the flood never filled the strangers' slots");
  static const h_put puts[] = {
      {.rank = 0, .name = "w", .dtype = "F32", .ndim = 2, .shape = {8, 4}, .boxed = 1, .start = {0, 0}, .count = {4, 4}},
      {.rank = 1, .name = "w", .dtype = "F32", .ndim = 2, .shape = {8, 4}, .boxed = 1, .start = {4, 0}, .count = {4, 4}},
  };
  h_script s = {.opts = {.save = "flooded", .dir = "ck/flooded", .world_size = 2, .nnodes = 2, .leader = N[0].addr},
                .puts = puts, .nputs = 2, .seed = 16};
  run_ranks(&s);
  h_expect_committed(&s);
  h_check_script(&s);
  cr_assert_leq(peers_field(0, "connections_unauthenticated"), 32);
  expect_alive(0);
  cr_assert_neq(waitpid(flood, NULL, WNOHANG), flood, "the flood ended before the save did");
  kill(flood, SIGKILL);
  h_reap(flood);
  h_shared_free(s.sh);
}

/* ------------------------------------------------------------------------ *
 * Leader state
 * ------------------------------------------------------------------------ */
static void send_join(int fd, const char *save) {
  char j[512];
  snprintf(j, sizeof j,
           "{\"t\":\"join\",\"save\":\"%s\",\"tok\":\"0123456789abcdef\",\"node\":1,\"dir\":\"ck/%s\","
           "\"prefix\":\"model\",\"write_mode\":\"owner\",\"nnodes\":4096,\"world_size\":4096,"
           "\"max_shard_size\":1000000,\"metadata\":{},\"overwrite\":false}",
           save, save);
  send_frame(fd, j);
}

/* The next frame other than a ping, or NULL when the connection closed. */
static json_t *next_message(int fd) {
  for (;;) {
    json_t *f = read_frame(fd);
    if (!f || strcmp(json_string_value(json_object_get(f, "t")), "ping") != 0) return f;
    json_decref(f);
  }
}

static int leading(json_t *peers, const char *save) {
  json_t *arr = json_object_get(peers, "leader_saves"), *e;
  size_t i;
  json_array_foreach(arr, i, e) if (strcmp(json_string_value(json_object_get(e, "save")), save) == 0) return 1;
  return 0;
}

/* Authenticated peers' joins each create leader state (4096 nodes: a few hundred KiB): past
 * max_leader_saves the join is refused with limit_exceeded, and status lists what is held. Each
 * of four peers joins one save (one peer alone may hold only half the room: test_peer_trust.c). */
Test(peer_flood, leader_state_is_limited_and_listed) {
  const char *lim[] = {"--max-leader-saves", "3", NULL};
  start_node_with(0, token_path, lim);
  int fds[4];
  char save[32];
  for (int k = 0; k < 4; k++) {
    char name[16];
    snprintf(name, sizeof name, "greedy%d", k);
    fds[k] = tcp_connect(N[0].addr);
    peer_login(fds[k], token_path, name);
    snprintf(save, sizeof save, "greedy-%d", k);
    send_join(fds[k], save);
    if (k < 3) sleep_ms(50); /* in this order */
  }
  int fd = fds[3];
  json_t *m = next_message(fd);
  cr_assert_not_null(m, "no answer to the fourth join");
  cr_assert_str_eq(json_string_value(json_object_get(m, "t")), "abort");
  cr_assert_str_eq(json_string_value(json_object_get(m, "save")), "greedy-3");
  cr_assert_str_eq(json_string_value(json_object_get(m, "code")), "limit_exceeded");
  const char *msg = json_string_value(json_object_get(m, "message"));
  cr_assert(strstr(msg, "max_leader_saves=3"), "the refusal names the limit: %s", msg);
  json_decref(m);

  json_t *p = peers_status(0);
  json_t *arr = json_object_get(p, "leader_saves");
  cr_assert_eq(json_array_size(arr), 3, "status lists %zu leader states", json_array_size(arr));
  for (int k = 0; k < 3; k++) {
    snprintf(save, sizeof save, "greedy-%d", k);
    cr_assert(leading(p, save), "status does not list %s", save);
  }
  json_t *e = json_array_get(arr, 0);
  cr_assert_eq(json_integer_value(json_object_get(e, "nnodes")), 4096);
  cr_assert_eq(json_integer_value(json_object_get(e, "joined")), 1);
  cr_assert_str_eq(json_string_value(json_object_get(e, "state")), "collecting");
  cr_assert_gt(json_integer_value(json_object_get(e, "memory_bytes")), 4096 * 64, "memory_bytes is accounted");
  cr_assert_eq(json_integer_value(json_object_get(p, "max_leader_saves")), 3);
  json_decref(p);
  cr_assert(log_has(0, "max_leader_saves=3"));
  char out[4096];
  snprintf(H.sock, sizeof H.sock, "%s", N[0].d.sock);
  cr_assert_eq(h_shardctl(out, sizeof out, "status", NULL), 0, "%s", out);
  cr_assert(strstr(out, "leader states: 3 of max 3"), "%s", out);
  cr_assert(strstr(out, "leading greedy-1: collecting, 1 of 4096 nodes joined"), "%s", out);

  /* Their connections gone, the saves fail; remembered failures give way to a new save. */
  for (int k = 0; k < 4; k++) close(fds[k]);
  F_POLL(peers_field(0, "saves_leading") == 0);
  cr_assert_eq(peers_field(0, "saves_leading"), 0, "the lost peer's saves did not fail");
  fd = tcp_connect(N[0].addr);
  peer_login(fd, token_path, "greedy");
  send_join(fd, "greedy-4");
  int found = 0;
  for (int64_t until = f_now_ms() + F_WAIT_MS; !found && f_now_ms() < until;) {
    p = peers_status(0);
    found = leading(p, "greedy-4");
    if (found) cr_assert_eq(json_array_size(json_object_get(p, "leader_saves")), 3);
    json_decref(p);
    if (!found) sleep_ms(10);
  }
  cr_assert(found, "a failed leader state did not give way to a new save");
  close(fd);
}

/* ------------------------------------------------------------------------ *
 * Logs
 * ------------------------------------------------------------------------ */
/* Before login: an error frame full of terminal escapes, a forged line and 1000 bytes is logged
 * escaped and cut, under the socket's real address, not the listener the hello claims. */
Test(peer_flood, what_a_stranger_sends_is_escaped_in_the_log_under_its_real_address) {
  start_node(0, token_path);
  int fd = tcp_connect(N[0].addr);
  send_frame(fd, "{\"t\":\"hello\",\"v\":3,\"node\":\"\\u001b[31mevil\",\"listen\":\"10.9.9.9:7077\",\"nonce\":\"" NONCE
                 "\"}");
  json_t *h = read_frame(fd);
  cr_assert_not_null(h);
  json_decref(h);
  char err[2048];
  int n = snprintf(err, sizeof err,
                   "{\"t\":\"error\",\"code\":\"protocol_error\",\"message\":\"\\u001b[2J\\u001b]0;pwned\\u0007 RED"
                   "\\r\\nshardd error: forged ");
  for (int k = 0; k < 1000; k++) err[n++] = 'x';
  snprintf(err + n, sizeof err - (size_t)n, "\"}");
  send_frame(fd, err);
  cr_assert_null(read_frame(fd), "the connection must be closed");
  close(fd);
  const char *needle = "sent an error before logging in";
  F_POLL(log_has(0, needle));
  char *log = h_slurp(N[0].d.log, NULL);
  cr_assert_not_null(log);
  char *line = strstr(log, needle);
  cr_assert_not_null(line, "no log line for the error frame; log:\n%s", log);
  while (line > log && line[-1] != '\n') line--;
  char *end = strchr(line, '\n');
  cr_assert_not_null(end);
  *end = '\0';
  cr_assert_null(strchr(log, '\x1b'), "a raw ESC reached the log");
  cr_assert_null(strchr(line, '\a'));
  cr_assert(strstr(line, "\\x1b[2J\\x1b]0;pwned\\x07 RED\\x0d\\x0ashardd error: forged"), "not escaped: %s", line);
  cr_assert(strstr(line, "peer connection from 127.0.0.1:"), "the real address is not named: %s", line);
  cr_assert(strstr(line, "xxx..."), "a long message is not cut: %s", line);
  cr_assert_lt(strlen(line), 600, "the line is %zu bytes long", strlen(line));
  *end = '\n';
  cr_assert_null(strstr(log, "10.9.9.9"), "the claimed listener reached the log");
  free(log);
}
