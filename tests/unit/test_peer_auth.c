/* Peer authentication: HMAC proofs against an independent vector, role separation, token files, addresses. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "peer.h"

static const uint8_t TOKEN[] = "correct horse battery staple 42";
#define TLEN (sizeof TOKEN - 1)

static void nonces(uint8_t a[32], uint8_t b[32]) {
  for (int i = 0; i < 32; i++) {
    a[i] = (uint8_t)i;
    b[i] = (uint8_t)(100 + i);
  }
}

/* The connection of the vectors: node-a (nonce a) dialled node-b (nonce b). */
static sd_peer_transcript conn(const uint8_t *a, const uint8_t *b) {
  return (sd_peer_transcript){.connector = "node-a", .acceptor = "node-b", .connector_nonce = a, .acceptor_nonce = b};
}

/* Computed with Python's hmac module over "shardd-peer-v2" || role || 0 || Nc || Na || len16 || "node-a" || len16
 * || "node-b". */
Test(peer_auth, proof_matches_an_independent_hmac) {
  uint8_t a[32], b[32], mac[32];
  char hex[65];
  nonces(a, b);
  sd_peer_transcript t = conn(a, b);
  cr_assert_eq(sd_peer_proof(TOKEN, TLEN, "connector", &t, mac), 0);
  sd_peer_hex(mac, 32, hex);
  cr_assert_str_eq(hex, "063d077295ee9566adc5ccc9cbf3aa629fc67a9134fe798700a240136cf2886a");
  cr_assert_eq(sd_peer_proof(TOKEN, TLEN, "acceptor", &t, mac), 0);
  sd_peer_hex(mac, 32, hex);
  cr_assert_str_eq(hex, "e37cdbd9311a7ddee103c836ef8841bddcd34cbe61f01e26aeef218455ba346d");
}

Test(peer_auth, check_accepts_only_the_right_proof) {
  uint8_t a[32], b[32], mac[32];
  char hex[65];
  nonces(a, b);
  sd_peer_transcript t = conn(a, b);
  /* The connector proves to the acceptor. */
  sd_peer_proof(TOKEN, TLEN, "connector", &t, mac);
  sd_peer_hex(mac, 32, hex);
  cr_assert(sd_peer_proof_check(TOKEN, TLEN, "connector", &t, hex));
  /* Upper-case hex is the same proof. */
  char up[65];
  for (int i = 0; i < 65; i++) up[i] = (char)(hex[i] >= 'a' && hex[i] <= 'f' ? hex[i] - 32 : hex[i]);
  cr_assert(sd_peer_proof_check(TOKEN, TLEN, "connector", &t, up));
  /* Reflected as the acceptor's proof, the nonces swapped (the other direction), the names swapped
   * or changed (another pair of daemons), another token: all refused. */
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "acceptor", &t, hex));
  sd_peer_transcript swapped = conn(b, a);
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &swapped, hex));
  sd_peer_transcript names = {.connector = "node-b", .acceptor = "node-a", .connector_nonce = a, .acceptor_nonce = b};
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &names, hex));
  /* The length in front of each name: moving a byte from one name to the other is another proof. */
  sd_peer_transcript moved = {.connector = "node-an", .acceptor = "ode-b", .connector_nonce = a, .acceptor_nonce = b};
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &moved, hex));
  static const uint8_t other[] = "correct horse battery staple 43";
  cr_assert_not(sd_peer_proof_check(other, sizeof other - 1, "connector", &t, hex));
  /* One flipped bit, a short proof, garbage, nothing. */
  hex[10] = hex[10] == '0' ? '1' : '0';
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &t, hex));
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &t, "abcd"));
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &t,
                                    "zz" "3d077295ee9566adc5ccc9cbf3aa629fc67a9134fe798700a240136cf2886a"));
  cr_assert_not(sd_peer_proof_check(TOKEN, TLEN, "connector", &t, NULL));
}

Test(peer_auth, nonces_are_fresh) {
  uint8_t x[32], y[32];
  cr_assert_eq(sd_peer_random(x, sizeof x), 0);
  cr_assert_eq(sd_peer_random(y, sizeof y), 0);
  cr_assert_neq(memcmp(x, y, sizeof x), 0);
}

Test(peer_auth, hex_round_trip) {
  uint8_t in[5] = {0, 0x7f, 0x80, 0xab, 0xff}, out[5];
  char hex[11];
  sd_peer_hex(in, 5, hex);
  cr_assert_str_eq(hex, "007f80abff");
  cr_assert_eq(sd_peer_unhex(hex, out, 5), 0);
  cr_assert_eq(memcmp(in, out, 5), 0);
  cr_assert_eq(sd_peer_unhex("007f80abf", out, 5), -1);
  cr_assert_eq(sd_peer_unhex("007f80abfg", out, 5), -1);
}

/* ------------------------------------------------------------------------ *
 * Token files
 * ------------------------------------------------------------------------ */
static char *token_file(const char *content, mode_t mode) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/shardd-token-XXXXXX");
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
  fchmod(fd, mode);
  close(fd);
  return path;
}

Test(peer_auth, token_file_rules) {
  uint8_t *tok = NULL;
  size_t len = 0;
  sd_error err = {0};
  char *p = token_file("0123456789abcdef0123\n\n", 0600);
  cr_assert_eq(sd_peer_token_load(p, &tok, &len, &err), 0, "%s", err.msg);
  cr_assert_eq(len, 20, "trailing new lines are not part of the secret");
  cr_assert_eq(memcmp(tok, "0123456789abcdef0123", 20), 0);
  free(tok);
  unlink(p);

  p = token_file("0123456789abcdef0123\n", 0640);
  cr_assert_eq(sd_peer_token_load(p, &tok, &len, &err), SHARDD_E_PERMISSION);
  cr_assert(strstr(err.msg, "chmod 600"), "%s", err.msg);
  unlink(p);

  p = token_file("short\n", 0600);
  cr_assert_eq(sd_peer_token_load(p, &tok, &len, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "16 to 4096 bytes"), "%s", err.msg);
  unlink(p);

  cr_assert_eq(sd_peer_token_load("/nonexistent/token", &tok, &len, &err), SHARDD_E_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "/nonexistent/token"), "%s", err.msg);
}

/* ------------------------------------------------------------------------ *
 * Addresses
 * ------------------------------------------------------------------------ */
Test(peer_auth, addresses) {
  char host[SD_PEER_ADDR_MAX];
  unsigned port = 0;
  sd_error err = {0};
  cr_assert_eq(sd_peer_addr_split("127.0.0.1:7077", host, sizeof host, &port, &err), 0);
  cr_assert_str_eq(host, "127.0.0.1");
  cr_assert_eq(port, 7077);
  cr_assert_eq(sd_peer_addr_split("node-3.cluster:0", host, sizeof host, &port, &err), 0);
  cr_assert_str_eq(host, "node-3.cluster");
  cr_assert_eq(port, 0);
  cr_assert_eq(sd_peer_addr_split("[::1]:65535", host, sizeof host, &port, &err), 0);
  cr_assert_str_eq(host, "::1");
  cr_assert_eq(port, 65535);
  const char *bad[] = {"", "host", "host:", ":80", "host:65536", "host:-1", "host:+1", "::1:80", "[::1]80",
                       "host:8x"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(sd_peer_addr_split(bad[i], host, sizeof host, &port, &err), SHARDD_E_INVALID_ARGUMENT, "'%s'",
                 bad[i]);
}

static int hello(const char *js, sd_peer_hello *out, sd_error *err) {
  json_t *h = json_loads(js, 0, NULL);
  cr_assert_not_null(h, "%s", js);
  int rc = sd_peer_hello_parse(h, out, err);
  json_decref(h);
  return rc;
}

#define N64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

Test(peer_auth, hello_fields) {
  sd_peer_hello h;
  sd_error err;
  cr_assert_eq(hello("{\"t\":\"hello\",\"v\":3,\"node\":\"n1\",\"nonce\":\"" N64 "\",\"listen\":\"10.0.0.1:7077\"}", &h,
                     &err), 0);
  cr_assert_str_eq(h.name, "n1");
  cr_assert_str_eq(h.listen, "10.0.0.1:7077");
  cr_assert_eq(h.nonce[1], 0x11);
  /* No listener announced (a node that does not listen): accepted, listen empty. */
  cr_assert_eq(hello("{\"v\":3,\"node\":\"n1\",\"nonce\":\"" N64 "\"}", &h, &err), 0);
  cr_assert_str_eq(h.listen, "");
  cr_assert_eq(hello("{\"v\":1,\"node\":\"n1\",\"nonce\":\"" N64 "\"}", &h, &err), SHARDD_E_UNSUPPORTED_PROTO);
  cr_assert(strstr(err.msg, "version 1 is not supported (this daemon speaks 3)"), "%s", err.msg);
  /* version 2's manifests are not version 3's: a v2 node is refused at the door, not as malformed later */
  cr_assert_eq(hello("{\"v\":2,\"node\":\"n1\",\"nonce\":\"" N64 "\"}", &h, &err), SHARDD_E_UNSUPPORTED_PROTO);
  cr_assert(strstr(err.msg, "version 2 is not supported (this daemon speaks 3)"), "%s", err.msg);
  cr_assert_eq(hello("{\"node\":\"n1\",\"nonce\":\"" N64 "\"}", &h, &err), SHARDD_E_UNSUPPORTED_PROTO);
  cr_assert_eq(hello("{\"v\":3,\"node\":\"\",\"nonce\":\"" N64 "\"}", &h, &err), SHARDD_E_PROTOCOL);
  cr_assert_eq(hello("{\"v\":3,\"node\":\"n1\",\"nonce\":\"0011\"}", &h, &err), SHARDD_E_PROTOCOL);
  cr_assert_eq(hello("{\"v\":3,\"node\":7,\"nonce\":\"" N64 "\"}", &h, &err), SHARDD_E_PROTOCOL);
  char big[512];
  snprintf(big, sizeof big, "{\"v\":3,\"node\":\"%0129d\",\"nonce\":\"" N64 "\"}", 0);
  cr_assert_eq(hello(big, &h, &err), SHARDD_E_PROTOCOL, "a node name over %d bytes", SD_PEER_NAME_MAX);
}
