/* Escaping untrusted text for log lines: control characters and bytes that are not UTF-8 become \xNN, bounded length. */
#ifndef SD_ESCAPE_H
#define SD_ESCAPE_H

#include <stddef.h>

/* Bytes of untrusted input a log line shows before "..." (a peer's error message, a node name). */
#define SD_ESCAPE_LOG 256
/* Room for SD_ESCAPE_LOG input bytes, each escaped to 4, the "..." and the NUL. */
#define SD_ESCAPE_BUF (4 * SD_ESCAPE_LOG + 4)

/* Copies at most max_in bytes of in[0..inlen) into out as printable text: C0 controls, DEL,
 * C1 controls (U+0080..U+009F) and bytes outside valid UTF-8 become "\xNN" (lower-case hex);
 * valid UTF-8 is kept. When input is left over (max_in or outsz reached), "..." follows. A
 * multi-byte character or an escape is never cut. Always NUL-terminates (outsz >= 1); returns
 * the length written. Escaping escaped text changes nothing: a backslash is kept as is. */
size_t sd_escape(const char *in, size_t inlen, size_t max_in, char *out, size_t outsz);

typedef struct {
  char s[SD_ESCAPE_BUF];
} sd_escbuf;

/* s (NUL-terminated; NULL reads as "") escaped and cut at SD_ESCAPE_LOG bytes, in b. */
const char *sd_esc(sd_escbuf *b, const char *s);

#endif
