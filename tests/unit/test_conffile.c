/* The config key table and the config file's text (daemon/config.c), parsed without a daemon. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "sd_confline.h"

static sd_config c;
static sd_error err;

static void setup(void) {
  memset(&c, 0, sizeof c);
  memset(&err, 0, sizeof err);
  cr_assert_eq(sd_config_defaults(&c, &err), 0, "%s", err.msg);
}
static void teardown(void) { sd_config_free(&c); }

TestSuite(conffile, .init = setup, .fini = teardown);

static int parse(const char *text, unsigned *lines) {
  return sd_config_parse_text(&c, text, strlen(text), "f.conf", lines, &err);
}

static const char *value(const char *key) {
  static char buf[4096];
  const sd_config_key *k = sd_config_find_key(key);
  cr_assert_not_null(k, "no key %s", key);
  sd_config_format(&c, k, buf, sizeof buf);
  return buf;
}

Test(conffile, defaults) {
  cr_assert_eq(c.queue_depth, 64);
  cr_assert_eq(c.socket_mode, 0660);
  cr_assert_eq(c.log_level, SD_LOG_INFO);
  cr_assert_eq(c.log_syslog_prefix, SD_SYSLOG_AUTO);
  cr_assert_eq(c.max_line, 16u * 1024 * 1024);
  cr_assert_str_eq(c.socket_group, "");
  cr_assert_eq(c.socket_gid, -1);
  cr_assert(c.root && *c.root && c.socket_path && *c.socket_path);
  cr_assert_str_eq(value("socket_mode"), "0660");
  cr_assert_str_eq(value("log_level"), "info");
}

/* The copy stage follows the cores, capped, and never runs with no thread. */
Test(conffile, copy_threads_default_and_bounds) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned want = n < 1 ? 1 : n > 8 ? 8 : (unsigned)n;
  cr_assert_eq(c.copy_threads, want, "default %u, the online cores capped at 8 are %u", c.copy_threads, want);
  cr_assert_eq(parse("copy_threads = 3\n", NULL), 0, "%s", err.msg);
  cr_assert_eq(c.copy_threads, 3);
  cr_assert_str_eq(value("copy_threads"), "3");
  cr_assert_neq(parse("copy_threads = 0\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'copy_threads': must be an integer in [1, 256], got '0'");
  cr_assert_neq(parse("copy_threads = -2\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'copy_threads': must be an integer in [1, 256], got '-2'");
  cr_assert_eq(c.copy_threads, 3, "a refused value changed the setting");
}

Test(conffile, comments_blanks_and_spacing) {
  unsigned lines[64] = {0};
  cr_assert_leq(sd_config_nkeys, 64);
  const char *text =
      "# leading comment\n"
      "\n"
      "   \t\n"
      "queue_depth=12\n"
      "  log_level =   debug   # trailing comment\n"
      "root = /data/ckpt#1\n"
      "socket_mode = 0600\r\n"
      "max_line = 2M";                        /* no final newline */
  cr_assert_eq(parse(text, lines), 0, "%s", err.msg);
  cr_assert_eq(c.queue_depth, 12);
  cr_assert_eq(c.log_level, SD_LOG_DEBUG);
  cr_assert_str_eq(c.root, "/data/ckpt#1", "a '#' inside a value is part of it");
  cr_assert_eq(c.socket_mode, 0600);
  cr_assert_eq(c.max_line, 2u << 20);
  const sd_config_key *k = sd_config_find_key("log_level");
  cr_assert_eq(lines[k - sd_config_keys], 5);
  cr_assert_eq(lines[sd_config_find_key("keep_results") - sd_config_keys], 0);
}

Test(conffile, unknown_key_names_file_line_and_key) {
  cr_assert_eq(parse("queue_depth = 3\n\nfrobnicate = yes\n", NULL), SHARDD_E_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "f.conf:3: unknown key 'frobnicate'");
}

Test(conffile, bad_values_name_line_key_and_value) {
  cr_assert_neq(parse("queue_depth = 0\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'queue_depth': must be an integer in [1, 4096], got '0'");
  cr_assert_neq(parse("\nqueue_depth = -5\n", NULL), 0);
  cr_assert(strstr(err.msg, "f.conf:2: key 'queue_depth'"), "%s", err.msg);
  cr_assert_neq(parse("queue_depth = 12abc\n", NULL), 0);
  cr_assert_neq(parse("queue_depth = 99999999999999999999999\n", NULL), 0);
  cr_assert_neq(parse("max_line = 3X\n", NULL), 0);
  cr_assert(strstr(err.msg, "key 'max_line': must be a byte count in [1024, "), "%s", err.msg);
  cr_assert_neq(parse("max_line = 17179869184T\n", NULL), 0, "overflowing suffix accepted");
  cr_assert_neq(parse("socket_mode = 0999\n", NULL), 0);
  cr_assert(strstr(err.msg, "must be octal permission bits"), "%s", err.msg);
  cr_assert_neq(parse("socket_mode = 01777\n", NULL), 0, "setuid/sticky bits accepted");
  cr_assert_neq(parse("log_level = loud\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'log_level': must be one of error, warn, info, debug, got 'loud'");
  cr_assert_neq(parse("root =\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'root': must not be empty");
}

Test(conffile, structural_errors) {
  cr_assert_neq(parse("queue_depth 12\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: expected 'key = value', got 'queue_depth 12'");
  cr_assert_neq(parse(" = 12\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: a key is missing before '='");
  cr_assert_neq(parse("log_level = info\nqueue_depth = 2\nlog_level = warn\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:3: key 'log_level' is already set on line 1");
  const char nul[] = "queue_depth = 1\0 2\n";
  cr_assert_neq(sd_config_parse_text(&c, nul, sizeof nul - 1, "f.conf", NULL, &err), 0);
  cr_assert(strstr(err.msg, "NUL"), "%s", err.msg);
  cr_assert_neq(parse("Queue_Depth = 2\n", NULL), 0, "keys are case-sensitive");
  cr_assert_neq(parse("queue-depth = 2\n", NULL), 0, "the file uses '_', flags use '-'");
}

Test(conffile, empty_string_value_allowed_where_it_means_none) {
  cr_assert_eq(parse("socket_group =\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.socket_group, "");
  cr_assert_eq(parse("socket_group = # nothing\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.socket_group, "");
}

/* ------------------------------------------------------------------------ *
 * Quoted values (shardd.conf(5)): the text inside the quotes, or an error
 * ------------------------------------------------------------------------ */
Test(conffile, double_quoted_value_is_the_text_inside) {
  cr_assert_eq(parse("root = \"/data/ckpt\"\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.root, "/data/ckpt", "the quotes were kept");
  cr_assert_eq(parse("root = \"/data/my ckpt #2\"   # a comment after the quote\r\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.root, "/data/my ckpt #2", "a quoted ' #' is not a comment");
  cr_assert_eq(parse("node_name=\"  padded  \"\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.node_name, "  padded  ", "blanks inside quotes are kept");
  cr_assert_eq(parse("queue_depth = \"12\"\nsocket_mode = \"0600\"\nlog_level = \"debug\"\n", NULL), 0, "%s",
               err.msg);
  cr_assert_eq(c.queue_depth, 12, "a quoted number is a number");
  cr_assert_eq(c.socket_mode, 0600);
  cr_assert_eq(c.log_level, SD_LOG_DEBUG);
}

Test(conffile, double_quotes_take_backslash_escapes) {
  cr_assert_eq(parse("node_name = \"a\\\"b\\\\c\"\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.node_name, "a\"b\\c");
  cr_assert_neq(parse("node_name = \"a\\nb\"\n", NULL), 0, "an unknown escape is accepted");
  cr_assert_str_eq(err.msg, "f.conf:1: key 'node_name': unknown escape '\\n' in a double-quoted value"
                            " (only \\\" and \\\\ are escapes)");
}

Test(conffile, single_quotes_are_literal) {
  cr_assert_eq(parse("root = '/data/a\\b \"c\"'\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.root, "/data/a\\b \"c\"");
  cr_assert_eq(parse("socket_group = ''\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.socket_group, "", "'' is the empty string");
  cr_assert_neq(parse("root = \"\"\n", NULL), 0, "an empty quoted root is accepted");
  cr_assert_str_eq(err.msg, "f.conf:1: key 'root': must not be empty");
}

Test(conffile, unterminated_quote_names_file_line_and_key) {
  cr_assert_neq(parse("queue_depth = 3\nroot = \"/data/ckpt\n", NULL), 0, "an unclosed quote is accepted");
  cr_assert_str_eq(err.msg, "f.conf:2: key 'root': the value opens a double quote that is not closed on the line");
  cr_assert_neq(parse("root = '/data/ckpt\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'root': the value opens a single quote that is not closed on the line");
  cr_assert_neq(parse("root = \"/data/ckpt\\\"\n", NULL), 0, "an escaped quote must not close the value");
  cr_assert(strstr(err.msg, "not closed"), "%s", err.msg);
}

Test(conffile, text_after_the_closing_quote_is_refused) {
  cr_assert_neq(parse("\n\nroot = \"/data\"/ckpt\n", NULL), 0, "text after the quote is accepted");
  cr_assert_str_eq(err.msg, "f.conf:3: key 'root': text after the closing quote: '/ckpt'");
  cr_assert_neq(parse("root = \"/a\" \"/b\"  # two\n", NULL), 0);
  cr_assert_str_eq(err.msg, "f.conf:1: key 'root': text after the closing quote: '\"/b\"'");
  cr_assert_neq(parse("root = '/a'b\n", NULL), 0);
  cr_assert(strstr(err.msg, "key 'root': text after the closing quote: 'b'"), "%s", err.msg);
}

Test(conffile, quotes_inside_an_unquoted_value_are_kept) {
  cr_assert_eq(parse("root = /data/\"x\"\nnode_name = it's\n", NULL), 0, "%s", err.msg);
  cr_assert_str_eq(c.root, "/data/\"x\"");
  cr_assert_str_eq(c.node_name, "it's");
}

/* Values --check-config must quote to read back: blanks at the ends, a ' #', a leading quote. */
Test(conffile, quote_for_the_printed_form) {
  static const char *const vals[] = {"/plain/path#1", "", " lead", "trail ", "a #b", "\"q\"", "'s", "#x", "a\\\"b"};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    char q[256], line[300];
    size_t need = sd_conf_quote(vals[i], q, sizeof q);
    cr_assert_eq(need, strlen(q), "%s", vals[i]);
    snprintf(line, sizeof line, "node_name = %s\n", q);
    cr_assert_eq(parse(line, NULL), 0, "%s: %s", line, err.msg);
    cr_assert_str_eq(c.node_name, vals[i], "'%s' printed as %s", vals[i], q);
  }
  char q[64];
  sd_conf_quote("/plain", q, sizeof q);
  cr_assert_str_eq(q, "/plain", "a plain value is printed plain");
}

/* What --check-config prints reads back to the same settings. */
Test(conffile, every_key_round_trips_through_its_printed_form) {
  cr_assert_eq(parse("queue_depth = 7\nlog_level = error\nsocket_mode = 640\nmax_line = 4K\nroot = /r\n", NULL), 0,
               "%s", err.msg);
  char text[1 << 14];
  size_t n = 0;
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    char v[4096];
    sd_config_format(&c, &sd_config_keys[i], v, sizeof v);
    n += (size_t)snprintf(text + n, sizeof text - n, "%s = %s\n", sd_config_keys[i].name, v);
  }
  sd_config again;
  memset(&again, 0, sizeof again);
  cr_assert_eq(sd_config_defaults(&again, &err), 0);
  cr_assert_eq(sd_config_parse_text(&again, text, n, "printed", NULL, &err), 0, "%s\n%s", err.msg, text);
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    char a[4096], b[4096];
    sd_config_format(&c, &sd_config_keys[i], a, sizeof a);
    sd_config_format(&again, &sd_config_keys[i], b, sizeof b);
    cr_assert_str_eq(a, b, "key %s: '%s' printed, '%s' read back", sd_config_keys[i].name, a, b);
  }
  cr_assert_eq(again.socket_mode, 0640);
  cr_assert_eq(again.max_line, 4096);
  sd_config_free(&again);
}

Test(conffile, table_is_consistent) {
  for (size_t i = 0; i < sd_config_nkeys; i++) {
    const sd_config_key *k = &sd_config_keys[i];
    cr_assert(k->help && *k->help, "key %s has no help", k->name);
    cr_assert_eq(sd_config_find_key(k->name), k, "key %s is listed twice", k->name);
    for (const char *p = k->name; *p; p++)
      cr_assert((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_', "key %s: odd character",
                k->name);
    if (k->type == SD_CT_NUM || k->type == SD_CT_BYTES) cr_assert_leq(k->lo, k->hi, "key %s bounds", k->name);
    cr_assert(k->size == 1 || k->size == 2 || k->size == 4 || k->size == 8, "key %s: field size %zu", k->name,
              k->size);
  }
}
