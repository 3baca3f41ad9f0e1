/* libshardd's requests about the daemon rather than a save: its status (with counters) and deleting a checkpoint. */
#include <stdlib.h>

#include <jansson.h>

#include "client_int.h"
#include "shardd/shardd.h"

SHARDD_EXPORT int shardd_status(shardd_client *c, char **json_out) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!json_out) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "status: json_out is NULL");
  *json_out = NULL;
  json_t *r;
  /* With the daemon's counters (the "metrics" object), for shardctl metrics. */
  int rc = sd_client_request(c, json_pack("{s:s, s:b}", "op", "status", "metrics", 1), &r);
  if (rc) return rc;
  json_object_del(r, "id");
  json_object_del(r, "ok");
  *json_out = json_dumps(r, JSON_COMPACT);
  json_decref(r);
  if (!*json_out) return sd_client_fail(c, SHARDD_E_NO_MEMORY, "cannot encode the status reply");
  return 0;
}

SHARDD_EXPORT int shardd_delete(shardd_client *c, const char *dir) {
  if (!c) return SHARDD_E_INVALID_ARGUMENT;
  if (!dir) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "delete: dir is NULL");
  json_t *req = json_pack("{s:s, s:s}", "op", "delete", "dir", dir);
  if (!req) return sd_client_fail(c, SHARDD_E_INVALID_ARGUMENT, "delete: dir is not valid UTF-8");
  return sd_client_request(c, req, NULL);
}
