/* The config key table and the config file's text (daemon/config.c), parsed without a daemon. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

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
