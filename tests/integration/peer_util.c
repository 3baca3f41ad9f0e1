/* Multi-node tests: daemons listening for peers on loopback, their ranks, and a raw peer-protocol client. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cluster_plan.h"
#include "peer.h"
#include "peer_util.h"

pu_node N[PU_MAX_NODES];
int rank_node[H_MAX_RANKS];
int node_rank_of[PU_MAX_NODES];

void pu_reset(void) {
  memset(N, 0, sizeof N);
  for (int i = 0; i < PU_MAX_NODES; i++) node_rank_of[i] = i;
}

void pu_scratch(const char *tag) {
  pu_reset();
  f_scratch(&H, tag);
}

void pu_teardown(void) {
  /* Every surviving daemon must stop cleanly (exit 0, socket removed). */
  for (int i = 0; i < PU_MAX_NODES; i++) f_stop(&N[i].d, 1);
  f_scratch_remove(H.base);
}

void sleep_ms(int ms) { f_sleep_ms(ms); }

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void write_token(const char *path, const char *secret) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
  cr_assert_eq(write(fd, secret, strlen(secret)), (ssize_t)strlen(secret));
  close(fd);
}

json_t *node_status(int i) {
  shardd_client *c = NULL;
  int rc = shardd_connect(N[i].d.sock, &c);
  cr_assert_eq(rc, 0, "node %d: %s", i, shardd_last_error(NULL));
  char *js = NULL;
  rc = shardd_status(c, &js);
  cr_assert_eq(rc, 0, "node %d status: %s", i, shardd_last_error(c));
  shardd_close(c);
  json_t *st = json_loads(js, 0, NULL);
  shardd_free(js);
  cr_assert_not_null(st);
  return st;
}

void start_node(int i, const char *token) { start_node_with(i, token, NULL); }

void start_node_with(int i, const char *token, const char *const *extra) { start_node_env(i, token, extra, NULL); }

void start_node_env(int i, const char *token, const char *const *extra, const char *const *env) {
  h_daemon *d = &N[i].d;
  snprintf(d->base, sizeof d->base, "%s", H.base);
  snprintf(d->root, sizeof d->root, "%s", H.root);
  snprintf(d->sock, sizeof d->sock, "%s/node%d.sock", H.base, i);
  snprintf(d->log, sizeof d->log, "%s/node%d.log", H.base, i);
  char name[16];
  snprintf(name, sizeof name, "node%d", i);
  f_opts o = {.extra = extra, .env = env, .peer_token = token, .node_name = name};
  f_start(d, &o);
  json_t *st = node_status(i);
  const char *listen = json_string_value(json_object_get(json_object_get(st, "peers"), "listen"));
  cr_assert_not_null(listen, "node %d status has no peers.listen", i);
  snprintf(N[i].addr, sizeof N[i].addr, "%s", listen);
  json_decref(st);
}

int log_has(int i, const char *needle) { return f_log_count(N[i].d.log, needle) > 0; }

/* The ranks node i's log says it described to the leader for save `save`. */
static int described(int i, const char *save) {
  char needle[256];
  snprintf(needle, sizeof needle, "save '%s': described ", save);
  char *log = h_slurp(N[i].d.log, NULL);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, needle)); p += strlen(needle)) n += atoi(p + strlen(needle));
  free(log);
  return n;
}

void await_described(int i, const char *save, int n) {
  int64_t deadline = f_now_ms() + H_WAIT_MS;
  while (described(i, save) < n) {
    if (f_now_ms() > deadline) {
      f_dump_log(&N[i].d);
      cr_assert_fail("node %d never described %d ranks of save '%s' to the leader", i, n, save);
    }
    f_sleep_ms(5);
  }
}

void peer_rank(int idx, void *arg) {
  h_script *s = arg;
  int node = rank_node[idx];
  snprintf(H.sock, sizeof H.sock, "%s", N[node].d.sock);
  s->opts.node_rank = node_rank_of[node];
  h_rank_main(idx, s);
}

void start_ranks(h_script *s, pid_t *pids) {
  if (!s->sh) s->sh = h_shared_new();
  for (int r = 0; r < s->opts.world_size; r++) pids[r] = h_fork(peer_rank, r, s);
}

void run_ranks(h_script *s) {
  pid_t pids[H_MAX_RANKS];
  start_ranks(s, pids);
  h_reap_all(s, pids);
}

int tcp_connect(const char *addr) {
  char host[64];
  int port;
  cr_assert_eq(sscanf(addr, "%63[^:]:%d", host, &port), 2);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, host, &sa.sin_addr);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0, "%s", strerror(errno));
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_frame(int fd, const char *json) {
  uint8_t len[4] = {0, 0, (uint8_t)(strlen(json) >> 8), (uint8_t)strlen(json)};
  cr_assert_eq(write(fd, len, 4), 4);
  cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
}

json_t *read_frame(int fd) {
  uint8_t len[4];
  size_t got = 0;
  while (got < 4) {
    ssize_t r = read(fd, len + got, 4 - got);
    if (r <= 0) return NULL;
    got += (size_t)r;
  }
  size_t n = (size_t)len[0] << 24 | (size_t)len[1] << 16 | (size_t)len[2] << 8 | len[3];
  cr_assert_lt(n, 65536);
  char *buf = malloc(n + 1);
  got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    cr_assert_gt(r, 0);
    got += (size_t)r;
  }
  json_t *j = json_loadb(buf, n, 0, NULL);
  free(buf);
  return j;
}

/* The secret in token_path, without its trailing white space (as the daemon reads it). */
static char *token_of(const char *token_path, size_t *tlen) {
  char *token = h_slurp(token_path, tlen);
  cr_assert_not_null(token);
  while (*tlen && (token[*tlen - 1] == '\n' || token[*tlen - 1] == ' ')) (*tlen)--;
  return token;
}

static void send_hello(int fd, const char *name, const uint8_t nonce[SD_PEER_NONCE_LEN]) {
  char nhex[2 * SD_PEER_NONCE_LEN + 1], hello[512];
  sd_peer_hex(nonce, SD_PEER_NONCE_LEN, nhex);
  snprintf(hello, sizeof hello, "{\"t\":\"hello\",\"v\":3,\"node\":\"%s\",\"nonce\":\"%s\",\"listen\":\"127.0.0.1:1\"}",
           name, nhex);
  send_frame(fd, hello);
}

/* The daemon's hello: its name into name (n bytes), its nonce into nonce. */
static void take_hello(int fd, char *name, size_t n, uint8_t nonce[SD_PEER_NONCE_LEN]) {
  json_t *h = read_frame(fd);
  cr_assert_not_null(h, "no hello from the daemon");
  cr_assert_str_eq(json_string_value(json_object_get(h, "t")), "hello", "%s", json_dumps(h, 0));
  cr_assert_eq(sd_peer_unhex(json_string_value(json_object_get(h, "nonce")), nonce, SD_PEER_NONCE_LEN), 0);
  snprintf(name, n, "%s", json_string_value(json_object_get(h, "node")));
  json_decref(h);
}

static void send_proof(int fd, const char *token_path, const char *role, const sd_peer_transcript *t) {
  size_t tlen = 0;
  char *token = token_of(token_path, &tlen);
  uint8_t mac[SD_PEER_MAC_LEN];
  char phex[2 * SD_PEER_MAC_LEN + 1], auth[128];
  cr_assert_eq(sd_peer_proof((const uint8_t *)token, tlen, role, t, mac), 0);
  free(token);
  sd_peer_hex(mac, sizeof mac, phex);
  snprintf(auth, sizeof auth, "{\"t\":\"auth\",\"proof\":\"%s\"}", phex);
  send_frame(fd, auth);
}

void peer_login(int fd, const char *token_path, const char *name) {
  uint8_t nonce[SD_PEER_NONCE_LEN], theirs[SD_PEER_NONCE_LEN];
  char daemon[SD_PEER_NAME_MAX + 1];
  cr_assert_eq(sd_peer_random(nonce, sizeof nonce), 0);
  send_hello(fd, name, nonce);
  take_hello(fd, daemon, sizeof daemon, theirs);
  sd_peer_transcript t = {.connector = name, .acceptor = daemon, .connector_nonce = nonce, .acceptor_nonce = theirs};
  send_proof(fd, token_path, "connector", &t);
  json_t *a = read_frame(fd);
  cr_assert_not_null(a, "the daemon closed the connection instead of logging us in");
  cr_assert_str_eq(json_string_value(json_object_get(a, "t")), "auth", "%s", json_dumps(a, 0));
  json_decref(a);
}

void peer_accept_login(int fd, const char *token_path, const char *name) {
  uint8_t nonce[SD_PEER_NONCE_LEN], theirs[SD_PEER_NONCE_LEN];
  char daemon[SD_PEER_NAME_MAX + 1];
  take_hello(fd, daemon, sizeof daemon, theirs);
  cr_assert_eq(sd_peer_random(nonce, sizeof nonce), 0);
  send_hello(fd, name, nonce);
  json_t *a = read_frame(fd);
  cr_assert_not_null(a, "the daemon closed the connection instead of proving itself");
  cr_assert_str_eq(json_string_value(json_object_get(a, "t")), "auth", "%s", json_dumps(a, 0));
  json_decref(a);
  sd_peer_transcript t = {.connector = daemon, .acceptor = name, .connector_nonce = theirs, .acceptor_nonce = nonce};
  send_proof(fd, token_path, "acceptor", &t);
}

void table_digest(const char *tensors, char *hex) {
  json_t *ts = json_loads(tensors, 0, NULL);
  cr_assert(json_is_array(ts), "a table: %s", tensors);
  sd_ctable_hash *h = sd_ctable_hash_new();
  for (size_t i = 0; i < json_array_size(ts); i++) {
    json_t *e = json_array_get(ts, i), *shape = json_array_get(e, 2);
    uint64_t dims[SD_MAX_DIMS];
    for (size_t d = 0; d < json_array_size(shape); d++) dims[d] = (uint64_t)json_integer_value(json_array_get(shape, d));
    sd_dtype dt;
    sd_error err;
    cr_assert_eq(sd_dtype_parse(json_string_value(json_array_get(e, 1)), &dt, &err), 0);
    sd_ctable_hash_add(h, json_string_value(json_array_get(e, 0)), dt, (uint32_t)json_array_size(shape), dims,
                       json_integer_value(json_array_get(e, 3)), json_string_value(json_array_get(e, 5)));
  }
  uint8_t d[SD_CTABLE_DIGEST];
  cr_assert_eq(sd_ctable_hash_end(h, d), 0);
  sd_ctable_hex(d, hex);
  json_decref(ts);
}

void send_table(int fd, const char *save, const char *tok, const char *tensors) {
  char hex[2 * SD_CTABLE_DIGEST + 1];
  table_digest(tensors, hex);
  size_t n = strlen(tensors) + 512;
  char *m = malloc(n);
  snprintf(m, n, "{\"t\":\"table\",\"save\":\"%s\",\"node\":1,\"tok\":\"%s\",\"digest\":\"%s\",\"from\":0,"
           "\"tensors\":%s}", save, tok, hex, tensors);
  send_frame(fd, m);
  free(m);
}

json_t *read_until(int fd, const char *kind, const char *save, const char *tok, const char *tensors) {
  for (json_t *a; (a = read_frame(fd)); json_decref(a)) {
    const char *t = json_string_value(json_object_get(a, "t")), *s = json_string_value(json_object_get(a, "save"));
    if (t && !strcmp(t, "send_table") && tensors) send_table(fd, save, tok, tensors);
    if (t && !strcmp(t, kind) && s && !strcmp(s, save)) return a;
  }
  return NULL;
}
