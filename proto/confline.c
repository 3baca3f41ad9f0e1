/* Splits a shardd.conf line into key and value: comments, blanks and quoted values (shardd.conf(5)). */
#include <stdio.h>
#include <string.h>

#include "sd_confline.h"

static int is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

/* Where a comment starts in s (a '#' at s's start, which follows a blank
 * or the line's start, or after a blank), or the terminating NUL. */
static char *comment_start(char *s, int at_start_ok) {
  for (char *p = s; *p; p++)
    if (*p == '#' && ((p == s && at_start_ok) || (p > s && is_blank(p[-1])))) return p;
  return s + strlen(s);
}

static void trim_right(char *s, char *end) {
  while (end > s && is_blank(end[-1])) end--;
  *end = '\0';
}

/* Unquotes the value at v in place (v[0] is the quote). */
static sd_conf_line_kind unquote(char *v, char *why, size_t whyn) {
  char q = v[0], *r = v + 1, *w = v;
  for (;; r++) {
    if (!*r) {
      snprintf(why, whyn, "the value opens a %s quote that is not closed on the line",
               q == '"' ? "double" : "single");
      return SD_CONF_BAD_VALUE;
    }
    if (*r == q) break;
    if (q == '"' && *r == '\\') {
      if (r[1] != '"' && r[1] != '\\') {
        snprintf(why, whyn, "unknown escape '\\%.1s' in a double-quoted value (only \\\" and \\\\ are escapes)",
                 r[1] ? r + 1 : "");
        return SD_CONF_BAD_VALUE;
      }
      r++;
    }
    *w++ = *r;
  }
  char *after = r + 1;
  while (is_blank(*after)) after++;
  if (*after && *after != '#') {
    char *end = comment_start(after, 1);
    trim_right(after, end);
    snprintf(why, whyn, "text after the closing quote: '%.100s'", after);
    return SD_CONF_BAD_VALUE;
  }
  *w = '\0';
  return SD_CONF_PAIR;
}

sd_conf_line_kind sd_conf_line(char *line, char **key, char **value, char *why, size_t whyn) {
  char *s = line;
  while (is_blank(*s)) s++;
  if (!*s || *s == '#') return SD_CONF_BLANK;
  /* The '=' counts only before any comment. */
  char *eq = NULL;
  for (char *p = s; *p && !eq; p++) {
    if (*p == '#' && is_blank(p[-1])) break;
    if (*p == '=') eq = p;
  }
  if (!eq) {
    trim_right(s, comment_start(s, 0));
    snprintf(why, whyn, "expected 'key = value', got '%.200s'", s);
    return SD_CONF_BAD_LINE;
  }
  trim_right(s, eq);
  if (!*s) {
    snprintf(why, whyn, "a key is missing before '='");
    return SD_CONF_BAD_LINE;
  }
  *key = s;
  char *v = eq + 1;
  while (is_blank(*v)) v++;
  *value = v;
  if (*v == '"' || *v == '\'') return unquote(v, why, whyn);
  /* end[-1] is inside the line: a '#' right after the '=' is part of the value. */
  char *end = v;
  while (*end && !(*end == '#' && is_blank(end[-1]))) end++;
  trim_right(v, end);
  return SD_CONF_PAIR;
}

size_t sd_conf_quote(const char *value, char *out, size_t n) {
  size_t len = strlen(value);
  int plain = !(len && (is_blank(value[0]) || is_blank(value[len - 1]))) && value[0] != '"' && value[0] != '\'' &&
              value[0] != '#';
  for (size_t i = 1; plain && i < len; i++)
    if (value[i] == '#' && is_blank(value[i - 1])) plain = 0;
  if (plain) return (size_t)snprintf(out, n, "%s", value);
  size_t need = 2;
  for (const char *p = value; *p; p++) need += 1 + (*p == '"' || *p == '\\');
  if (n > 0) {
    size_t j = 0;
    if (j + 1 < n) out[j++] = '"';
    for (const char *p = value; *p && j + 1 < n; p++) {
      if ((*p == '"' || *p == '\\') && j + 2 < n) out[j++] = '\\';
      out[j++] = *p;
    }
    if (j + 1 < n) out[j++] = '"';
    out[j] = '\0';
  }
  return need;
}
