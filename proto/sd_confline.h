/* One line of shardd.conf split into key and value: comments, blanks, and values in double or single quotes. */
#ifndef SD_CONFLINE_H
#define SD_CONFLINE_H

#include <stddef.h>

typedef enum {
  SD_CONF_BLANK = 0,     /* nothing but blanks and a comment */
  SD_CONF_PAIR = 1,      /* *key and *value set */
  SD_CONF_BAD_LINE = -1, /* no key = value shape: why says what; *key unset */
  SD_CONF_BAD_VALUE = -2 /* *key set, the value's quoting is wrong: why says how */
} sd_conf_line_kind;

/* Splits line (NUL-terminated, no '\n'; modified in place) into *key and
 * *value, both pointing into line. Blanks are spaces, tabs and '\r'. A
 * comment starts at a '#' at the start of the line or after a blank. A
 * value starting with '"' ends at the next unescaped '"', with \" and \\ its
 * only escapes; one starting with '\'' ends at the next '\'' and has none.
 * The quotes are removed. After the closing quote only blanks and a comment
 * may follow. An unquoted value runs to the comment or the end of the line,
 * trailing blanks removed; quotes inside it are kept. */
sd_conf_line_kind sd_conf_line(char *line, char **key, char **value, char *why, size_t whyn);

/* value as a config file would have to spell it: as is when the unquoted
 * reading gives it back, else in double quotes with '"' and '\\' escaped.
 * Returns the length it needs, like snprintf. */
size_t sd_conf_quote(const char *value, char *out, size_t n);

#endif
