/* The Prometheus renderer (proto/prom.c) shared by shardctl metrics and GET /metrics: families, labels, the scrape-target extras. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "sd_prom.h"

static json_t *status_with(const char *save_name, json_t **metrics) {
  json_error_t je;
  json_t *st = json_loads("{\"saves\":[{\"save\":\"s\",\"state\":\"writing\",\"bytes_written\":5,"
                          "\"bytes_planned\":9}],"
                          "\"metrics\":{\"saves_committed\":3,\"saves_failed\":1,\"save_errors\":{\"gap\":1},"
                          "\"bytes_written\":4096,\"puts\":7,\"uptime_seconds\":1.5,"
                          "\"save_duration_seconds\":{\"sum\":0.25,\"count\":3,"
                          "\"buckets\":[{\"le\":0.1,\"count\":1},{\"le\":0.5,\"count\":3}]},"
                          "\"save_write_seconds\":{\"sum\":0.125,\"count\":3}}}",
                          0, &je);
  cr_assert_not_null(st, "%s", je.text);
  json_object_set_new(json_array_get(json_object_get(st, "saves"), 0), "save", json_string(save_name));
  *metrics = json_object_get(st, "metrics");
  return st;
}

Test(prom, families_values_and_no_extras_without_a_version) {
  json_t *m, *st = status_with("step-1", &m);
  size_t len = 0;
  char *t = sd_prom_render(st, m, NULL, &len);
  cr_assert_not_null(t);
  cr_assert_eq(len, strlen(t));
  cr_assert(strstr(t, "# TYPE shardd_saves_total counter\nshardd_saves_total{result=\"committed\"} 3\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_saves_total{result=\"failed\"} 1\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_save_errors_total{code=\"gap\"} 1\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_bytes_written_total 4096\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_save_duration_seconds_bucket{le=\"0.1\"} 1\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_save_duration_seconds_bucket{le=\"+Inf\"} 3\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_save_duration_seconds_sum 0.25\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_save_bytes_written{save=\"step-1\",state=\"writing\"} 5\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_uptime_seconds 1.5\n"), "%s", t);
  cr_assert_null(strstr(t, "shardd_up "), "shardctl's text has no shardd_up");
  cr_assert_null(strstr(t, "shardd_build_info"), "shardctl's text has no build info");
  cr_assert_eq(t[len - 1], '\n');
  free(t);
  json_decref(st);
}

Test(prom, scrape_target_adds_up_and_build_info_first) {
  json_t *m, *st = status_with("s", &m);
  char *plain = sd_prom_render(st, m, NULL, NULL);
  size_t len = 0;
  char *t = sd_prom_render(st, m, "1.2.3-\"rc\"", &len);
  cr_assert(strncmp(t, "# HELP shardd_up ", 17) == 0, "%s", t);
  cr_assert(strstr(t, "\n# TYPE shardd_up gauge\nshardd_up 1\n"), "%s", t);
  cr_assert(strstr(t, "\n# TYPE shardd_build_info gauge\nshardd_build_info{version=\"1.2.3-\\\"rc\\\"\"} 1\n"), "%s",
            t);
  /* The rest is exactly what shardctl prints. */
  const char *rest = strstr(t, "# HELP shardd_saves_total");
  cr_assert_not_null(rest);
  cr_assert_str_eq(rest, plain);
  free(t);
  free(plain);
  json_decref(st);
}

Test(prom, label_values_are_escaped) {
  json_t *m, *st = status_with("a\"b\\c\nd", &m);
  char *t = sd_prom_render(st, m, NULL, NULL);
  cr_assert(strstr(t, "shardd_save_bytes_planned{save=\"a\\\"b\\\\c\\nd\",state=\"writing\"} 9\n"), "%s", t);
  free(t);
  json_decref(st);
}

Test(prom, committed_bytes_by_path_zero_copy_gathered_copied) {
  json_t *m, *st = status_with("s", &m);
  json_object_set_new(m, "writes_odirect", json_integer(4));
  json_object_set_new(m, "bytes_zero_copy", json_integer(3000));
  json_object_set_new(m, "bytes_gathered", json_integer(1000));
  json_object_set_new(m, "bytes_copied", json_integer(96));
  char *t = sd_prom_render(st, m, NULL, NULL);
  cr_assert_not_null(t);
  cr_assert(strstr(t, "\nshardd_data_writes_total{mode=\"odirect\"} 4\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_committed_bytes_total{path=\"zero_copy\"} 3000\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_committed_bytes_total{path=\"gathered\"} 1000\n"), "%s", t);
  cr_assert(strstr(t, "\nshardd_committed_bytes_total{path=\"copied\"} 96\n"), "%s", t);
  free(t);
  json_decref(st);
}

/* Scrapers of the names from before the split keep their series for one release, and an older daemon's
 * keys still fill the new ones. */
Test(prom, deprecated_direct_names_still_emitted) {
  static const char *const old_keys[] = {"writes_direct", "write_bytes_direct", "bytes_direct"};
  static const char *const want[] = {
      "\nshardd_writes_total{mode=\"direct\"} 7\n",           "\nshardd_write_bytes_total{mode=\"direct\"} 7\n",
      "\nshardd_saved_bytes_total{path=\"direct\"} 7\n",      "\nshardd_data_write_bytes_total{mode=\"odirect\"} 7\n",
      "\nshardd_committed_bytes_total{path=\"zero_copy\"} 7\n",
  };
  json_t *m, *st = status_with("s", &m);
  for (size_t i = 0; i < sizeof old_keys / sizeof old_keys[0]; i++)
    json_object_set_new(m, old_keys[i], json_integer(7));
  char *t = sd_prom_render(st, m, NULL, NULL);
  cr_assert_not_null(t);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_expect(strstr(t, want[i]), "lacks %s:\n%s", want[i], t);
  free(t);
  json_decref(st);
}
