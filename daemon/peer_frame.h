/* Peer frames (peer_frame.c), pure: u32 big-endian header length, header JSON, payload. */
#ifndef SD_PEER_FRAME_H
#define SD_PEER_FRAME_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "sd_error.h"

/* Before authentication a peer may send only small frames. */
#define SD_PEER_PREAUTH_MAX (64u << 10)
/* After it: a manifest of a million slices fits; a frame beyond this is a bug or an attack. */
#define SD_PEER_HEADER_MAX (1u << 30)
#define SD_PEER_PAYLOAD_MAX (1u << 30)

/* The longest message kind ("t") a frame may name; its header begins {"t":"KIND" (the encoder puts
 * it first), so the kind is known from the first bytes, before the rest is buffered. */
#define SD_FRAME_KIND_MAX 24
#define SD_FRAME_PEEK (sizeof "{\"t\":\"\"" - 1 + SD_FRAME_KIND_MAX)
/* Headers at least this long are parsed off the loop when the reader says so (offload). */
#define SD_FRAME_PARSE_LATER (1u << 20)
/* sd_frame_feed's answer when a long header is whole and waits for sd_frame_parse_header. */
#define SD_FRAME_PARSE_PENDING 2

/* The limits on a frame of this kind, from what the receiver expects of its sender now: 0, or a
 * SHARDD_E_* code (with the reason in err) to refuse it unread. */
typedef int (*sd_frame_cap_cb)(void *ud, const char *kind, size_t *header_max, size_t *payload_max, sd_error *err);

typedef struct {
  int stage;               /* 0 length, 1 header, 2 payload, 3 the header's first bytes (its kind) */
  uint8_t lenbuf[4];
  size_t have;             /* bytes of the current stage received */
  uint32_t hlen;
  char *hdr;
  json_t *parsed;          /* the header, while its payload arrives */
  uint64_t plen;
  uint8_t *payload;
  size_t header_max, payload_max;
  sd_frame_cap_cb cap;     /* NULL: header_max and payload_max for every kind */
  void *cap_ud;
  int offload;             /* stop with SD_FRAME_PARSE_PENDING at a header of SD_FRAME_PARSE_LATER bytes or more */
  uint8_t peek[SD_FRAME_PEEK];
  char kind[SD_FRAME_KIND_MAX + 1]; /* of the frame being read, when cap is set */
  size_t frame_payload_max;
} sd_frame_reader;

typedef int (*sd_frame_cb)(void *ud, json_t *hdr, uint8_t *payload, size_t plen);
void sd_frame_reader_init(sd_frame_reader *r, size_t header_max, size_t payload_max);
/* While a payload arrives: where its next bytes go and how many are still
 * missing, so a socket read can land there directly (sd_frame_feed then
 * skips the copy); NULL otherwise. */
uint8_t *sd_frame_direct(sd_frame_reader *r, size_t *room);
void sd_frame_reader_free(sd_frame_reader *r);
/* Feeds bytes; calls cb for each whole frame (cb owns hdr and payload).
 * A non-zero cb return stops and is returned. A malformed frame (length
 * over the limit, bad JSON, not an object, bad "len") returns
 * SHARDD_E_PROTOCOL with the reason in err. */
int sd_frame_feed(sd_frame_reader *r, const uint8_t *buf, size_t n, sd_frame_cb cb, void *ud,
                  sd_error *err);
/* The same, counting into *used the bytes taken: with offload set it stops after a long header
 * with SD_FRAME_PARSE_PENDING, the rest of buf untaken, until sd_frame_parse_header ran (on any
 * thread: it touches only the reader). A frame whose kind the cap refuses is refused with the
 * cap's code (SHARDD_E_LIMIT) before its header is buffered, one without its kind first with
 * SHARDD_E_PROTOCOL. */
int sd_frame_feed_some(sd_frame_reader *r, const uint8_t *buf, size_t n, size_t *used, sd_frame_cb cb, void *ud,
                       sd_error *err);
/* Parses the whole header a SD_FRAME_PARSE_PENDING left; 0 or an error as sd_frame_feed's. */
int sd_frame_parse_header(sd_frame_reader *r, sd_error *err);
/* Encodes a frame into one malloc'd buffer; sets "len" in hdr when the payload is not empty. The
 * header's "t" goes first, as readers with a cap need it. */
uint8_t *sd_frame_encode(json_t *hdr, const void *payload, size_t plen, size_t *out_len);
uint8_t *sd_frame_encodev(json_t *hdr, const struct iovec *iov, int niov, size_t *out_len);
/* A frame whose header is encoded and whose plen payload bytes, at
 * *payload_at, are left for the caller to fill (in another thread, say). */
uint8_t *sd_frame_alloc(json_t *hdr, size_t plen, size_t *payload_at, size_t *out_len);

#endif
