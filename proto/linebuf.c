/* Line framing for the JSON-lines protocol: a growable buffer that hands out complete lines. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sd_grow.h"
#include "sd_linebuf.h"

void sd_linebuf_init(sd_linebuf *lb, size_t max_line) {
  memset(lb, 0, sizeof *lb);
  lb->max_line = max_line ? max_line : SD_LINE_MAX_DEFAULT;
}

void sd_linebuf_free(sd_linebuf *lb) {
  free(lb->buf);
  lb->buf = NULL;
  lb->cap = lb->len = lb->head = lb->scan = 0;
}

size_t sd_linebuf_pending(const sd_linebuf *lb) { return lb->len - lb->head; }

char *sd_linebuf_reserve(sd_linebuf *lb, size_t want, size_t *avail) {
  if (want == 0) want = 1;
  /* Lines already handed out are dead: slide the pending tail to the front
   * so the buffer never grows beyond one line plus one read. */
  if (lb->head > 0) {
    size_t rest = lb->len - lb->head;
    memmove(lb->buf, lb->buf + lb->head, rest);
    lb->scan -= lb->head;
    lb->len = rest;
    lb->head = 0;
  }
  if (lb->cap - lb->len < want && (want > SIZE_MAX - lb->len || SD_GROW(lb->buf, lb->cap, lb->len + want, 4096)))
    return NULL;
  if (avail) *avail = lb->cap - lb->len;
  return lb->buf + lb->len;
}

void sd_linebuf_commit(sd_linebuf *lb, size_t n) {
  if (n > lb->cap - lb->len) n = lb->cap - lb->len;
  lb->len += n;
}

int sd_linebuf_feed(sd_linebuf *lb, const void *data, size_t n, sd_error *err) {
  if (n == 0) return 0;
  char *p = sd_linebuf_reserve(lb, n, NULL);
  if (!p) return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory buffering %zu bytes", n);
  memcpy(p, data, n);
  sd_linebuf_commit(lb, n);
  return 0;
}

int sd_linebuf_next(sd_linebuf *lb, char **line, size_t *len, sd_error *err) {
  size_t from = lb->scan > lb->head ? lb->scan : lb->head;
  char *nl = from < lb->len ? memchr(lb->buf + from, '\n', lb->len - from) : NULL;
  if (!nl) {
    lb->scan = lb->len;
    if (lb->len - lb->head > lb->max_line)
      return sd_fail(err, SHARDD_E_BAD_REQUEST, "line longer than %zu bytes", lb->max_line);
    return 0;
  }
  size_t end = (size_t)(nl - lb->buf);
  size_t n = end - lb->head;
  if (n > lb->max_line)
    return sd_fail(err, SHARDD_E_BAD_REQUEST, "line longer than %zu bytes", lb->max_line);
  char *s = lb->buf + lb->head;
  if (n > 0 && s[n - 1] == '\r') n--;
  s[n] = '\0';
  lb->head = end + 1;
  lb->scan = lb->head;
  *line = s;
  *len = n;
  return 1;
}
