/* Line framing: lines split across reads, several lines per read, CRLF, and the length cap. */
#include <criterion/criterion.h>
#include <string.h>

#include "sd_linebuf.h"

static sd_linebuf lb;

static void setup(void) { sd_linebuf_init(&lb, 16); }
static void teardown(void) { sd_linebuf_free(&lb); }

TestSuite(linebuf, .init = setup, .fini = teardown);

static void feed(const char *s) {
  sd_error err = {0};
  cr_assert_eq(sd_linebuf_feed(&lb, s, strlen(s), &err), 0);
}

static void expect_line(const char *want) {
  char *line;
  size_t len;
  sd_error err = {0};
  cr_assert_eq(sd_linebuf_next(&lb, &line, &len, &err), 1, "expected a line \"%s\"", want);
  cr_assert_eq(len, strlen(want));
  cr_assert_str_eq(line, want);
}

static void expect_none(void) {
  char *line;
  size_t len;
  sd_error err = {0};
  cr_assert_eq(sd_linebuf_next(&lb, &line, &len, &err), 0);
}

Test(linebuf, several_lines_in_one_read) {
  feed("a\nbb\n\nccc\n");
  expect_line("a");
  expect_line("bb");
  expect_line("");
  expect_line("ccc");
  expect_none();
  cr_assert_eq(sd_linebuf_pending(&lb), 0);
}

Test(linebuf, line_split_across_reads) {
  feed("{\"op\":");
  expect_none();
  cr_assert_eq(sd_linebuf_pending(&lb), 6);
  feed("1}");
  expect_none();
  feed("\nx");
  expect_line("{\"op\":1}");
  expect_none();
  feed("y\n");
  expect_line("xy");
}

Test(linebuf, crlf_is_stripped) {
  feed("abc\r\n\r\n");
  expect_line("abc");
  expect_line("");
}

Test(linebuf, byte_at_a_time) {
  const char *s = "hello\nworld\n";
  for (size_t i = 0; i < strlen(s); i++) {
    sd_error err = {0};
    cr_assert_eq(sd_linebuf_feed(&lb, s + i, 1, &err), 0);
  }
  expect_line("hello");
  expect_line("world");
  expect_none();
}

Test(linebuf, exact_limit_is_accepted) {
  feed("0123456789abcdef\n");
  expect_line("0123456789abcdef");
}

Test(linebuf, complete_line_over_limit_is_refused) {
  char *line;
  size_t len;
  sd_error err = {0};
  feed("0123456789abcdefg\n");
  cr_assert_eq(sd_linebuf_next(&lb, &line, &len, &err), SHARDD_E_BAD_REQUEST);
  cr_assert_eq(err.code, SHARDD_E_BAD_REQUEST);
  cr_assert_str_eq(err.msg, "line longer than 16 bytes");
}

Test(linebuf, partial_line_over_limit_is_refused_early) {
  char *line;
  size_t len;
  sd_error err = {0};
  feed("0123456789");
  cr_assert_eq(sd_linebuf_next(&lb, &line, &len, &err), 0);
  feed("abcdefXYZ");
  cr_assert_eq(sd_linebuf_next(&lb, &line, &len, &err), SHARDD_E_BAD_REQUEST);
}

Test(linebuf, reserve_and_commit_reads_in_place) {
  size_t avail = 0;
  char *p = sd_linebuf_reserve(&lb, 100, &avail);
  cr_assert_not_null(p);
  cr_assert_geq(avail, 100);
  memcpy(p, "abc\ndef", 7);
  sd_linebuf_commit(&lb, 7);
  expect_line("abc");
  /* The consumed line is dropped before the next read lands. */
  p = sd_linebuf_reserve(&lb, 10, &avail);
  memcpy(p, "\n", 1);
  sd_linebuf_commit(&lb, 1);
  expect_line("def");
  cr_assert_eq(lb.len, 4);
}

Test(linebuf, default_limit_is_16_mib) {
  sd_linebuf big;
  sd_linebuf_init(&big, 0);
  cr_assert_eq(big.max_line, 16u * 1024 * 1024);
  sd_linebuf_free(&big);
}
