/* Daemon-wide counters (saves, errors by code, bytes, puts, connections, durations, the writer's I/O) and their JSON form. */
#include <string.h>
#include <uv.h>

#include "metrics.h"
#include "ops.h"
#include "region.h"
#include "save.h"
#include "sd_error.h"

/* Codes are small negative numbers (shardd.h); room to spare for new ones. */
#define MAX_CODE 64

const double sd_metrics_buckets[SD_METRICS_NBUCKETS] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

static struct {
  uint64_t t_start;                 /* uv_hrtime at start */
  uint64_t connections, puts, bytes_put;
  uint64_t committed, failed, failed_by_code[MAX_CODE];
  uint64_t files_written, bytes_written;
  double duration_sum, write_sum;
  uint64_t duration_buckets[SD_METRICS_NBUCKETS]; /* not cumulative; summed when reported */
  uint64_t reloads, reloads_failed;
} m;

void sd_metrics_start(void) {
  memset(&m, 0, sizeof m);
  m.t_start = uv_hrtime();
}

void sd_metrics_connection(void) { m.connections++; }

void sd_metrics_put(uint64_t bytes) {
  m.puts++;
  m.bytes_put += bytes;
}

void sd_metrics_save_committed(uint64_t files, uint64_t bytes, double seconds, double write_seconds) {
  m.committed++;
  m.files_written += files;
  m.bytes_written += bytes;
  m.duration_sum += seconds;
  m.write_sum += write_seconds;
  for (int i = 0; i < SD_METRICS_NBUCKETS; i++) {
    if (seconds <= sd_metrics_buckets[i]) {
      m.duration_buckets[i]++;
      break;
    }
  }
}

void sd_metrics_save_failed(int code) {
  m.failed++;
  int i = -code;
  if (i <= 0 || i >= MAX_CODE) i = -SHARDD_E_INTERNAL;
  m.failed_by_code[i]++;
}

void sd_metrics_reload(int ok) {
  m.reloads++;
  if (!ok) m.reloads_failed++;
}

static json_t *u64(uint64_t v) { return json_integer((json_int_t)v); }

json_t *sd_metrics_json(const sd_daemon *d) {
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "uptime_seconds", json_real((double)(uv_hrtime() - m.t_start) / 1e9));
  json_object_set_new(o, "saves_committed", u64(m.committed));
  json_object_set_new(o, "saves_failed", u64(m.failed));
  json_t *errs = json_object();
  for (int i = 1; i < MAX_CODE; i++)
    if (m.failed_by_code[i]) json_object_set_new(errs, sd_err_name(-i), u64(m.failed_by_code[i]));
  json_object_set_new(o, "save_errors", errs);
  json_object_set_new(o, "files_written", u64(m.files_written));
  json_object_set_new(o, "bytes_written", u64(m.bytes_written));
  json_object_set_new(o, "puts", u64(m.puts));
  json_object_set_new(o, "bytes_put", u64(m.bytes_put));
  json_object_set_new(o, "connections", u64(m.connections));
  json_object_set_new(o, "reloads", u64(m.reloads));
  json_object_set_new(o, "reloads_failed", u64(m.reloads_failed));

  /* Gauges: read from the daemon's state now. */
  uint64_t writing = 0, pending = 0;
  for (const sd_save *s = d->saves; s; s = s->next) {
    if (s->state != SD_SAVE_WRITING) continue;
    writing++;
    uint64_t total = s->pub ? sd_publish_bytes_total(s->pub) : 0, done = sd_save_bytes_written(s);
    pending += total > done ? total - done : 0;
  }
  json_object_set_new(o, "clients", u64(d->nsessions));
  json_object_set_new(o, "regions", u64(sd_region_live()));
  json_object_set_new(o, "saves_in_flight", u64(d->nsaves));
  json_object_set_new(o, "saves_writing", u64(writing));
  json_object_set_new(o, "write_bytes_pending", u64(pending));
  json_object_set_new(o, "queue_depth", u64(d->cfg ? d->cfg->queue_depth : 0));

  /* The writer's own figures: zeros once it has closed (shutting down). */
  sd_writer_stats ws = {0};
  if (d->writer) sd_writer_get_stats(d->writer, &ws);
  json_object_set_new(o, "writes_direct", u64(ws.writes_direct));
  json_object_set_new(o, "writes_buffered", u64(ws.writes_buffered));
  json_object_set_new(o, "writes_registered", u64(ws.writes_fixed_buf));
  json_object_set_new(o, "write_bytes_direct", u64(ws.bytes_direct));
  json_object_set_new(o, "write_bytes_buffered", u64(ws.bytes_buffered));
  json_object_set_new(o, "staging_bytes", u64(ws.staging_bytes));
  json_object_set_new(o, "staging_peak_bytes", u64(ws.staging_peak));
  json_object_set_new(o, "staging_max_bytes", u64(ws.staging_max));
  json_object_set_new(o, "staging_registered", u64(ws.registered != 0));

  json_t *buckets = json_array();
  uint64_t cum = 0;
  for (int i = 0; i < SD_METRICS_NBUCKETS; i++) {
    cum += m.duration_buckets[i];
    json_array_append_new(buckets, json_pack("{s:f,s:I}", "le", sd_metrics_buckets[i], "count", (json_int_t)cum));
  }
  json_object_set_new(o, "save_duration_seconds",
                      json_pack("{s:f,s:I,s:o}", "sum", m.duration_sum, "count", (json_int_t)m.committed,
                                "buckets", buckets));
  json_object_set_new(o, "save_write_seconds",
                      json_pack("{s:f,s:I}", "sum", m.write_sum, "count", (json_int_t)m.committed));
  return o;
}
