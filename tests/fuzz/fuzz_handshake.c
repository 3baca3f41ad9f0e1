/* libFuzzer target: bytes as what a stranger sends on the peer port before login (real frame reader, hello and proof checks). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "peer.h"
#include "sd_escape.h"

/* The token and our nonce are fixed: a stranger cannot know the token, so no input may log in
 * unless it carries the one proof the token gives for the nonce it announced. */
static const uint8_t token[] = "fuzz-token-0123456789abcdef";
static const uint8_t own_nonce[SD_PEER_NONCE_LEN] = {1, 2, 3, 4, 5, 6, 7, 8, 9};

typedef struct {
  int outgoing;           /* we dialled: the peer owes the acceptor's proof */
  int state;              /* 0 hello, 1 auth, 2 logged in, 3 refused */
  sd_peer_hello hello;
  unsigned frames;
} hs;

/* What reaches a log line: printable, bounded, and escaping it again changes nothing. */
static void check_logged(const char *s) {
  sd_escbuf b;
  char again[SD_ESCAPE_BUF];
  const char *e = sd_esc(&b, s);
  size_t n = strlen(e);
  FUZZ_CHECK(n <= 4 * SD_ESCAPE_LOG + 3, "escaped text of %zu bytes", n);
  for (size_t i = 0; i < n; i++)
    FUZZ_CHECK((unsigned char)e[i] >= 0x20 && e[i] != 0x7f, "control byte 0x%02x kept at %zu", (unsigned char)e[i], i);
  /* The log line escapes the whole message once more: that must change nothing. */
  sd_escape(e, n, n, again, sizeof again);
  FUZZ_CHECK(strcmp(again, e) == 0, "escaping is not idempotent");
}

static int on_frame(void *ud, json_t *h, uint8_t *payload, size_t plen) {
  hs *x = ud;
  x->frames++;
  FUZZ_CHECK(json_is_object(h), "a frame header that is not an object");
  FUZZ_CHECK(plen == 0 && !payload, "a payload of %zu bytes before login", plen);
  free(payload);
  const char *t = json_string_value(json_object_get(h, "t"));
  if (t && strcmp(t, "error") == 0) {
    check_logged(json_string_value(json_object_get(h, "message")));
    x->state = 3;
  } else if (x->state == 0) {
    sd_error err = {0};
    int rc = t && strcmp(t, "hello") == 0 ? sd_peer_hello_parse(h, &x->hello, &err) : SHARDD_E_PROTOCOL;
    if (rc == 0) {
      FUZZ_CHECK(x->hello.name[0] && strlen(x->hello.name) <= SD_PEER_NAME_MAX, "hello name accepted");
      check_logged(x->hello.name);
      check_logged(x->hello.listen);
      if (x->hello.listen[0]) {
        char host[SD_PEER_ADDR_MAX];
        unsigned port = 0;
        if (sd_peer_addr_split(x->hello.listen, host, sizeof host, &port, &err) == 0)
          FUZZ_CHECK(port <= 65535 && host[0], "port %u, host '%s'", port, host);
      }
      x->state = 1;
    } else {
      FUZZ_CHECK(rc == SHARDD_E_PROTOCOL || rc == SHARDD_E_UNSUPPORTED_PROTO, "hello refused with %d", rc);
      FUZZ_CHECK(!t || strcmp(t, "hello") || err.msg[0], "a hello refused without a reason");
      x->state = 3;
    }
  } else {
    const char *proof = t && strcmp(t, "auth") == 0 ? json_string_value(json_object_get(h, "proof")) : NULL;
    const char *role = x->outgoing ? "acceptor" : "connector";
    sd_peer_transcript tr = x->outgoing ? (sd_peer_transcript){.connector = "fuzz-node", .acceptor = x->hello.name,
                                                               .connector_nonce = own_nonce,
                                                               .acceptor_nonce = x->hello.nonce}
                                        : (sd_peer_transcript){.connector = x->hello.name, .acceptor = "fuzz-node",
                                                               .connector_nonce = x->hello.nonce,
                                                               .acceptor_nonce = own_nonce};
    int ok = proof && sd_peer_proof_check(token, sizeof token - 1, role, &tr, proof);
    if (ok) {
      /* Only possible with the token: the proof must be exactly the one it gives. */
      uint8_t mac[SD_PEER_MAC_LEN];
      char hex[2 * SD_PEER_MAC_LEN + 1];
      FUZZ_CHECK(sd_peer_proof(token, sizeof token - 1, role, &tr, mac) == 0, "proof");
      sd_peer_hex(mac, sizeof mac, hex);
      FUZZ_CHECK(strcmp(hex, proof) == 0, "a proof other than the token's was accepted");
    }
    x->state = ok ? 2 : 3;
  }
  json_decref(h);
  /* A refused or logged-in connection reads no further handshake frames. */
  return x->state >= 2;
}

/* Byte 0: bit 0 we dialled; bits 1..7 the size of the reads the stream arrives in (1..128). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  hs x = {.outgoing = data[0] & 1};
  size_t chunk = (size_t)(data[0] >> 1) + 1;
  sd_frame_reader rd;
  sd_frame_reader_init(&rd, SD_PEER_PREAUTH_MAX, 0);
  int rc = 0;
  for (size_t at = 1; at < size && rc == 0;) {
    size_t n = size - at < chunk ? size - at : chunk;
    sd_error err = {0};
    rc = sd_frame_feed(&rd, data + at, n, on_frame, &x, &err);
    if (rc && rc != 1) {
      FUZZ_CHECK(rc == SHARDD_E_PROTOCOL && err.msg[0], "a malformed frame refused with %d and no reason", rc);
      check_logged(err.msg);
    }
    at += n;
  }
  FUZZ_CHECK(x.state != 2 || x.frames >= 2, "logged in without a hello and a proof");
  sd_frame_reader_free(&rd);
  return 0;
}
