/* The JSON view of the daemon-wide counters (saves, errors by code, bytes, puts, connections, durations, the writer's I/O). */
#include <string.h>
#include <uv.h>

#include "metrics.h"
#include "daemon.h"
#include "region.h"
#include "save.h"
#include "sd_error.h"

static json_t *u64(uint64_t v) { return json_integer((json_int_t)v); }

json_t *sd_metrics_json(const sd_daemon *d) {
  const sd_counters *c = &d->counters;
  json_t *o = json_object();
  if (!o) return NULL;
  json_object_set_new(o, "uptime_seconds", json_real((double)(uv_hrtime() - c->t_start) / 1e9));
  json_object_set_new(o, "saves_committed", u64(c->saves_committed));
  json_object_set_new(o, "saves_failed", u64(c->saves_failed));
  json_t *errs = json_object();
  for (int i = 1; i < SD_COUNT_CODES; i++)
    if (c->failed_by_code[i]) json_object_set_new(errs, sd_err_name(-i), u64(c->failed_by_code[i]));
  json_object_set_new(o, "save_errors", errs);
  json_object_set_new(o, "files_written", u64(c->files_committed));
  json_object_set_new(o, "bytes_written", u64(c->bytes_committed));
  json_object_set_new(o, "bytes_zero_copy", u64(c->bytes_zero_copy));
  /* Deprecated spellings, kept one release for scrapers: "direct" once meant zero-copy here and O_DIRECT below. */
  json_object_set_new(o, "bytes_direct", u64(c->bytes_zero_copy));
  json_object_set_new(o, "bytes_gathered", u64(c->bytes_gathered));
  json_object_set_new(o, "bytes_copied", u64(c->bytes_copied));
  json_object_set_new(o, "bytes_copied_sealed", u64(c->bytes_copied_sealed));
  json_object_set_new(o, "puts", u64(c->puts));
  json_object_set_new(o, "bytes_put", u64(c->bytes_put));
  json_object_set_new(o, "connections", u64(c->connections));
  json_object_set_new(o, "reloads", u64(c->reloads));
  json_object_set_new(o, "reloads_failed", u64(c->reloads_failed));

  /* Gauges: read from the daemon's state now. */
  uint64_t writing = 0, pending = 0;
  sd_save_writing_totals(d, &writing, &pending);
  json_object_set_new(o, "clients", u64(d->nsessions));
  json_object_set_new(o, "regions", u64(sd_region_live()));
  json_object_set_new(o, "saves_in_flight", u64(d->nsaves));
  json_object_set_new(o, "saves_writing", u64(writing));
  json_object_set_new(o, "write_bytes_pending", u64(pending));
  json_object_set_new(o, "queue_depth", u64(d->cfg ? d->cfg->queue_depth : 0));

  /* The writer's own figures: zeros once it has closed (shutting down). */
  sd_writer_stats ws = {0};
  if (d->writer) sd_writer_get_stats(d->writer, &ws);
  json_object_set_new(o, "writes_odirect", u64(ws.writes_odirect));
  json_object_set_new(o, "writes_direct", u64(ws.writes_odirect)); /* deprecated */
  json_object_set_new(o, "writes_buffered", u64(ws.writes_buffered));
  json_object_set_new(o, "writes_registered", u64(ws.writes_fixed_buf));
  json_object_set_new(o, "writes_zero_copy", u64(ws.writes_zero_copy));
  json_object_set_new(o, "pinned_bytes", u64(ws.pinned_bytes));
  json_object_set_new(o, "write_bytes_odirect", u64(ws.bytes_odirect));
  json_object_set_new(o, "write_bytes_direct", u64(ws.bytes_odirect)); /* deprecated */
  json_object_set_new(o, "write_bytes_buffered", u64(ws.bytes_buffered));
  json_object_set_new(o, "staging_bytes", u64(ws.staging_bytes));
  json_object_set_new(o, "staging_peak_bytes", u64(ws.staging_peak));
  json_object_set_new(o, "staging_max_bytes", u64(ws.staging_max));
  json_object_set_new(o, "staging_registered", u64(ws.registered != 0));
  json_object_set_new(o, "copy_threads", u64(ws.copy_threads));
  json_object_set_new(o, "copy_trips", u64(ws.copy_trips));
  json_object_set_new(o, "copy_trips_peak", u64(ws.copy_trips_peak));
  json_object_set_new(o, "files_open", u64(ws.files_open));
  json_object_set_new(o, "files_open_peak", u64(ws.files_open_peak));
  json_object_set_new(o, "max_open_files", u64(ws.max_open_files));
  json_object_set_new(o, "files_reopened", u64(ws.files_reopened));

  json_t *buckets = json_array();
  uint64_t cum = 0;
  for (int i = 0; i < SD_DURATION_NBUCKETS; i++) {
    cum += c->duration_buckets[i];
    json_array_append_new(buckets, json_pack("{s:f,s:I}", "le", sd_save_duration_buckets[i], "count", (json_int_t)cum));
  }
  json_object_set_new(o, "save_duration_seconds",
                      json_pack("{s:f,s:I,s:o}", "sum", c->duration_sum, "count", (json_int_t)c->saves_committed,
                                "buckets", buckets));
  json_object_set_new(o, "save_write_seconds",
                      json_pack("{s:f,s:I}", "sum", c->write_sum, "count", (json_int_t)c->saves_committed));
  return o;
}
