/* Line framing for the JSON-lines protocol: bytes in, complete '\n'-terminated lines out, with a length cap. */
#ifndef SD_LINEBUF_H
#define SD_LINEBUF_H

#include <stddef.h>

#include "sd_error.h"

#define SD_LINE_MAX_DEFAULT (16u * 1024u * 1024u)

typedef struct {
  char *buf;
  size_t cap;
  size_t head;      /* first byte of the pending line */
  size_t len;       /* bytes stored (from buf[0]) */
  size_t scan;      /* bytes before this offset hold no '\n' of the pending line */
  size_t max_line;  /* longest accepted line, '\n' excluded */
} sd_linebuf;

/* max_line 0 means SD_LINE_MAX_DEFAULT. */
void sd_linebuf_init(sd_linebuf *lb, size_t max_line);
void sd_linebuf_free(sd_linebuf *lb);

/* Space for at least `want` more bytes (read straight into it, then commit).
 * Returns NULL when out of memory. */
char *sd_linebuf_reserve(sd_linebuf *lb, size_t want, size_t *avail);
void sd_linebuf_commit(sd_linebuf *lb, size_t n);
/* reserve + copy + commit; SHARDD_E_NO_MEMORY on failure. */
int sd_linebuf_feed(sd_linebuf *lb, const void *data, size_t n, sd_error *err);

/* 1 and the next complete line (NUL-terminated in place, the '\n' and a
 * trailing '\r' dropped; valid until the next call on lb), 0 when no complete
 * line is buffered, or SHARDD_E_BAD_REQUEST when the line is longer than
 * max_line (the stream cannot be resynchronised: close it). */
int sd_linebuf_next(sd_linebuf *lb, char **line, size_t *len, sd_error *err);
/* Bytes of an incomplete line still buffered. */
size_t sd_linebuf_pending(const sd_linebuf *lb);

#endif
