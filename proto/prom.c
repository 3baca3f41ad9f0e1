/* Prometheus text exposition (version 0.0.4) of the daemon's status and metrics objects, for shardctl metrics and GET /metrics. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sd_prom.h"

static double num(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* A key by its name, or by the name an older shardd gave it. */
static double num_or(const json_t *o, const char *key, const char *old) {
  const json_t *v = json_object_get(o, key);
  return json_number_value(v ? v : json_object_get(o, old));
}

static const char *str(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "?";
}

static void prom_head(FILE *out, const char *name, const char *type, const char *help) {
  fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void prom_value(FILE *out, double v) {
  if (v == (double)(uint64_t)v && v < 9e15) fprintf(out, "%llu\n", (unsigned long long)v);
  else fprintf(out, "%.9g\n", v);
}

static void prom_simple(FILE *out, const char *name, const char *type, const char *help, double v) {
  prom_head(out, name, type, help);
  fprintf(out, "%s ", name);
  prom_value(out, v);
}

/* A family of one sample per label value: name{label="values[k]"} v[k]. */
static void prom_family(FILE *out, const char *name, const char *help, const char *label, const char *const values[],
                        const double v[], int n) {
  prom_head(out, name, "counter", help);
  for (int k = 0; k < n; k++) {
    fprintf(out, "%s{%s=\"%s\"} ", name, label, values[k]);
    prom_value(out, v[k]);
  }
}

/* Label values escape backslash, double quote and newline. */
static void prom_label(FILE *out, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"') fprintf(out, "\\%c", *v);
    else if (*v == '\n') fputs("\\n", out);
    else fputc(*v, out);
  }
}

/* The families as named before "direct" was split into O_DIRECT and zero-copy, kept one release so that
 * dashboards and alerts keep working; separate families, so that a sum over one never counts a byte twice. */
static void print_deprecated(FILE *out, const double writes[2], const double bytes[2], const double saved[3]) {
  static const char *const modes[2] = {"direct", "buffered"}, *const paths[3] = {"direct", "gathered", "copied"};
  static const struct {
    const char *name, *now, *label;
  } old[3] = {{"shardd_writes_total", "shardd_data_writes_total, mode direct now odirect", "mode"},
              {"shardd_write_bytes_total", "shardd_data_write_bytes_total, mode direct now odirect", "mode"},
              {"shardd_saved_bytes_total", "shardd_committed_bytes_total, path direct now zero_copy", "path"}};
  const double *v[3] = {writes, bytes, saved};
  for (int k = 0; k < 3; k++) {
    char help[128];
    snprintf(help, sizeof help, "Deprecated: %s.", old[k].now);
    prom_family(out, old[k].name, help, old[k].label, k < 2 ? modes : paths, v[k], k < 2 ? 2 : 3);
  }
}

static void print_prometheus(FILE *out, const json_t *st, const json_t *m) {
  prom_head(out, "shardd_saves_total", "counter", "Saves that ended since the daemon started, by result.");
  fprintf(out, "shardd_saves_total{result=\"committed\"} ");
  prom_value(out, num(m, "saves_committed"));
  fprintf(out, "shardd_saves_total{result=\"failed\"} ");
  prom_value(out, num(m, "saves_failed"));
  prom_head(out, "shardd_save_errors_total", "counter", "Failed saves by error code.");
  const char *code;
  json_t *v;
  json_object_foreach((json_t *)json_object_get(m, "save_errors"), code, v) {
    fprintf(out, "shardd_save_errors_total{code=\"");
    prom_label(out, code);
    fprintf(out, "\"} ");
    prom_value(out, json_number_value(v));
  }
  prom_simple(out, "shardd_bytes_written_total", "counter", "Bytes of committed checkpoints (shard files).",
              num(m, "bytes_written"));
  prom_simple(out, "shardd_files_written_total", "counter", "Shard files of committed checkpoints.",
              num(m, "files_written"));
  prom_simple(out, "shardd_puts_total", "counter", "Slices accepted by put.", num(m, "puts"));
  prom_simple(out, "shardd_put_bytes_total", "counter", "Bytes of the slices accepted by put.",
              num(m, "bytes_put"));
  prom_simple(out, "shardd_connections_total", "counter", "Client connections accepted.", num(m, "connections"));
  prom_simple(out, "shardd_config_reloads_total", "counter", "SIGHUP reloads handled.", num(m, "reloads"));
  prom_simple(out, "shardd_config_reload_failures_total", "counter", "SIGHUP reloads refused (invalid file).",
              num(m, "reloads_failed"));
  prom_simple(out, "shardd_clients", "gauge", "Open client connections.", num(m, "clients"));
  prom_simple(out, "shardd_regions", "gauge", "Shared-memory regions mapped.", num(m, "regions"));
  prom_simple(out, "shardd_saves_in_flight", "gauge", "Saves begun and not yet ended.", num(m, "saves_in_flight"));
  prom_simple(out, "shardd_saves_writing", "gauge", "Saves whose files are being written.",
              num(m, "saves_writing"));
  prom_simple(out, "shardd_write_bytes_pending", "gauge", "Bytes of saves being written not yet written.",
              num(m, "write_bytes_pending"));
  prom_simple(out, "shardd_io_queue_depth", "gauge", "io_uring queue depth (entries).", num(m, "queue_depth"));

  /* The writer's I/O and staging memory (absent from an older shardd). */
  if (json_object_get(m, "writes_odirect") || json_object_get(m, "writes_direct")) {
    static const char *const modes[2] = {"odirect", "buffered"};
    const double writes[2] = {num_or(m, "writes_odirect", "writes_direct"), num(m, "writes_buffered")};
    const double bytes[2] = {num_or(m, "write_bytes_odirect", "write_bytes_direct"), num(m, "write_bytes_buffered")};
    prom_family(out, "shardd_data_writes_total",
                "Data writes handed to io_uring, by mode (buffered: the file system refused O_DIRECT).",
                "mode", modes, writes, 2);
    prom_family(out, "shardd_data_write_bytes_total",
                "Bytes the kernel took from data writes, by mode (O_DIRECT ones include last-block padding).",
                "mode", modes, bytes, 2);
    prom_simple(out, "shardd_registered_buffer_writes_total", "counter",
                "Data writes from staging buffers registered with io_uring.", num(m, "writes_registered"));
    prom_simple(out, "shardd_zero_copy_writes_total", "counter",
                "Data writes straight from clients' shared memory, no staging copy.", num(m, "writes_zero_copy"));
    static const char *const paths[3] = {"zero_copy", "gathered", "copied"};
    const double saved[3] = {num_or(m, "bytes_zero_copy", "bytes_direct"), num(m, "bytes_gathered"),
                             num(m, "bytes_copied")};
    prom_family(out, "shardd_committed_bytes_total",
                "Bytes of committed saves, by path: zero-copy from shared memory, gathered from several ranks' "
                "memory in one write, or copied through staging.",
                "path", paths, saved, 3);
    print_deprecated(out, writes, bytes, saved);
    prom_simple(out, "shardd_staging_bytes", "gauge", "Staging buffer memory allocated now.",
                num(m, "staging_bytes"));
    prom_simple(out, "shardd_staging_peak_bytes", "gauge", "Most staging buffer memory allocated at once.",
                num(m, "staging_peak_bytes"));
    prom_simple(out, "shardd_staging_max_bytes", "gauge", "Bound on staging buffer memory (staging_mib).",
                num(m, "staging_max_bytes"));
    prom_simple(out, "shardd_staging_registered", "gauge",
                "1 when staging buffers are registered with io_uring, 0 when plain writes are used.",
                num(m, "staging_registered"));
    if (json_object_get(m, "max_open_files")) {
      prom_simple(out, "shardd_files_open", "gauge", "Checkpoint files open for writing now.", num(m, "files_open"));
      prom_simple(out, "shardd_files_open_peak", "gauge", "Most checkpoint files open for writing at once.",
                  num(m, "files_open_peak"));
      prom_simple(out, "shardd_max_open_files", "gauge", "Bound on checkpoint files open for writing (max_open_files).",
                  num(m, "max_open_files"));
      prom_simple(out, "shardd_files_reopened_total", "counter",
                  "Idle checkpoint files closed to make room under max_open_files.", num(m, "files_reopened"));
    }
  }

  const json_t *h = json_object_get(m, "save_duration_seconds");
  prom_head(out, "shardd_save_duration_seconds", "histogram", "Committed saves, first begin to publish.");
  const json_t *b;
  size_t i;
  json_array_foreach(json_object_get(h, "buckets"), i, b) {
    fprintf(out, "shardd_save_duration_seconds_bucket{le=\"%g\"} ", num(b, "le"));
    prom_value(out, num(b, "count"));
  }
  fprintf(out, "shardd_save_duration_seconds_bucket{le=\"+Inf\"} ");
  prom_value(out, num(h, "count"));
  fprintf(out, "shardd_save_duration_seconds_sum ");
  prom_value(out, num(h, "sum"));
  fprintf(out, "shardd_save_duration_seconds_count ");
  prom_value(out, num(h, "count"));
  const json_t *ws = json_object_get(m, "save_write_seconds");
  prom_head(out, "shardd_save_write_seconds", "summary", "Committed saves, last seal to publish (the write).");
  fprintf(out, "shardd_save_write_seconds_sum ");
  prom_value(out, num(ws, "sum"));
  fprintf(out, "shardd_save_write_seconds_count ");
  prom_value(out, num(ws, "count"));

  /* Per save in flight, for progress panels. */
  const json_t *saves = json_object_get(st, "saves");
  const char *names[2] = {"shardd_save_bytes_written", "shardd_save_bytes_planned"};
  const char *keys[2] = {"bytes_written", "bytes_planned"};
  const char *helps[2] = {"Bytes written so far of a save in flight.",
                          "Bytes a save in flight will write (bytes put while still open)."};
  for (int k = 0; k < 2; k++) {
    prom_head(out, names[k], "gauge", helps[k]);
    json_array_foreach(saves, i, b) {
      fprintf(out, "%s{save=\"", names[k]);
      prom_label(out, str(b, "save"));
      fprintf(out, "\",state=\"");
      prom_label(out, str(b, "state"));
      fprintf(out, "\"} ");
      prom_value(out, num(b, keys[k]));
    }
  }
  prom_simple(out, "shardd_uptime_seconds", "gauge", "Seconds since the daemon started.",
              num(m, "uptime_seconds"));
}


char *sd_prom_render(const json_t *status, const json_t *metrics, const char *version, size_t *len) {
  char *text = NULL;
  size_t n = 0;
  /* A stream into memory: the renderer stays one set of fprintf calls. */
  FILE *out = open_memstream(&text, &n);
  if (!out) return NULL;
  if (version) {
    prom_simple(out, "shardd_up", "gauge", "1 while the daemon answers (a failed scrape is the 0).", 1);
    prom_head(out, "shardd_build_info", "gauge", "The daemon's version, as a label; the value is 1.");
    fprintf(out, "shardd_build_info{version=\"");
    prom_label(out, version);
    fprintf(out, "\"} 1\n");
  }
  print_prometheus(out, status, metrics);
  int bad = ferror(out);
  if (fclose(out) != 0 || bad) {
    free(text);
    return NULL;
  }
  if (len) *len = n;
  return text;
}
