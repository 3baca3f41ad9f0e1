/* Escaping untrusted text for log lines: controls, C1, broken UTF-8, the length bound and idempotence. */
#include <criterion/criterion.h>
#include <string.h>

#include "sd_escape.h"

static const char *esc(const char *in, size_t max_in, size_t outsz) {
  static char out[4096];
  cr_assert_leq(outsz, sizeof out);
  size_t n = sd_escape(in, strlen(in), max_in, out, outsz);
  cr_assert_eq(n, strlen(out));
  cr_assert_lt(n, outsz);
  return out;
}

Test(escape, printable_text_and_utf8_unchanged) {
  cr_assert_str_eq(esc("node-a at 10.0.0.1:7077 \\ ok", 256, 1024), "node-a at 10.0.0.1:7077 \\ ok");
  cr_assert_str_eq(esc("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 256, 1024), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

Test(escape, controls_become_hex) {
  cr_assert_str_eq(esc("\x1b[31mred\x1b[0m\n\r\t\x7f", 256, 1024), "\\x1b[31mred\\x1b[0m\\x0a\\x0d\\x09\\x7f");
}

Test(escape, c1_controls_and_broken_utf8_become_hex) {
  /* U+009B (CSI) encoded in UTF-8, a lone continuation byte, an overlong '/', a surrogate, a cut sequence. */
  cr_assert_str_eq(esc("\xc2\x9b" "1m", 256, 1024), "\\xc2\\x9b1m");
  cr_assert_str_eq(esc("a\x80z", 256, 1024), "a\\x80z");
  cr_assert_str_eq(esc("\xc0\xaf", 256, 1024), "\\xc0\\xaf");
  cr_assert_str_eq(esc("\xed\xa0\x80", 256, 1024), "\\xed\\xa0\\x80");
  cr_assert_str_eq(esc("x\xe2\x82", 256, 1024), "x\\xe2\\x82");
  cr_assert_str_eq(esc("\xf4\x90\x80\x80", 256, 1024), "\\xf4\\x90\\x80\\x80");
}

Test(escape, bounded_by_input_bytes) {
  char big[1000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  const char *o = esc(big, 256, 2048);
  cr_assert_eq(strlen(o), 259);
  cr_assert_str_eq(o + 256, "...");
  /* Exactly at the bound: no mark. */
  big[256] = '\0';
  cr_assert_eq(strlen(esc(big, 256, 2048)), 256);
}

Test(escape, never_cuts_a_character_or_an_escape) {
  /* The bound falls inside a 3-byte character: it is left out whole. */
  cr_assert_str_eq(esc("ab\xe2\x82\xac", 3, 64), "ab...");
  /* The output fills up inside an escape: the escape is left out whole, the mark fits. */
  cr_assert_str_eq(esc("abcdef\x1b\x1b\x1b", 256, 12), "abcdef...");
  /* Room for the mark is made by dropping a whole multi-byte character. */
  cr_assert_str_eq(esc("a\xe2\x82\xac\xe2\x82\xac\xe2\x82\xac", 256, 9), "a\xe2\x82\xac...");
  cr_assert_str_eq(esc("abc", 256, 1), "");
}

Test(escape, idempotent) {
  const char *raw = "\x1b]0;pwned\x07 \xc2\x9b \xff end";
  char once[256], twice[256];
  sd_escape(raw, strlen(raw), 256, once, sizeof once);
  sd_escape(once, strlen(once), 256, twice, sizeof twice);
  cr_assert_str_eq(once, twice);
  cr_assert_null(strchr(once, '\x1b'));
}

Test(escape, esc_helper) {
  sd_escbuf b;
  cr_assert_str_eq(sd_esc(&b, NULL), "");
  cr_assert_str_eq(sd_esc(&b, "hi\x1b"), "hi\\x1b");
}
