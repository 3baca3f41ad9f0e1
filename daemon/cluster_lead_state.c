/* A leader's states: made from the first join, held against later joins, found, kept under max_leader_saves, listed, freed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_lead_int.h"
#include "pathsafe.h"
#include "sd_escape.h"
#include "sd_msg.h"

void sd_lead_release_plan(sd_lead *L) {
  if (L->planned) sd_cplan_free(&L->plan);
  L->planned = 0;
  free(L->sums);
  L->sums = NULL;
  free(L->acct);
  L->acct = NULL;
  sd_lead_man_free(L);
  sd_cmanifest_free(&L->man);
  free(L->rank_node);
  L->rank_node = NULL;
}

void sd_lead_free(sd_lead *L) {
  sd_cluster *cl = L->cl;
  for (sd_lead **pp = &cl->leads; *pp; pp = &(*pp)->next)
    if (*pp == L) {
      *pp = L->next;
      break;
    }
  sd_lead_release_plan(L);
  if (L->parent_fd >= 0) close(L->parent_fd);
  for (size_t i = 0; i < L->nmd; i++) {
    free((char *)L->md[i].key);
    free((char *)L->md[i].value);
  }
  free(L->md);
  free(L->nodes);
  free(L->began);
  free(L->tmp);
  free(L->dir);
  free(L->prefix);
  free(L->id);
  free(L);
}

sd_lead *sd_lead_find(sd_cluster *cl, const char *id) {
  uint64_t now = uv_now(cl->d->loop);
  for (sd_lead *L = cl->leads, *next; L; L = next) {
    next = L->next;
    /* Failed saves are remembered a while, so a late node learns why. */
    if (L->state == L_FAILED && !L->busy && now >= L->forget_at) sd_lead_free(L);
  }
  for (sd_lead *L = cl->leads; L; L = L->next)
    if (strcmp(L->id, id) == 0) return L;
  return NULL;
}

int sd_lead_room(sd_cluster *cl, const char *id, const char *by, sd_error *err) {
  unsigned max = cl->d->cfg ? cl->d->cfg->max_leader_saves : 0, n = 0, ghosts = 0;
  sd_lead *forget = NULL;
  for (sd_lead *L = cl->leads; L; L = L->next) {
    n++;
    if (L->state == L_FAILED && !L->busy) forget = L; /* new leads go to the head: the last is the oldest */
    if (by && L->state != L_FAILED && !L->nodes[0].joined && !strcmp(L->begun_by, by)) ghosts++;
  }
  /* Saves a peer began that this daemon's own ranks have not joined (yet) are its alone: it may
   * hold at most half the room, so no one node fills it with joins its leader never sees. */
  unsigned per_peer = max / 2 ? max / 2 : 1;
  if (by && max && ghosts >= per_peer) {
    sd_escbuf eb;
    return sd_fail(err, SHARDD_E_LIMIT, "node '%s' already began %u multi-node saves this daemon leads that its own "
                   "ranks have not joined (at most %u, half of max_leader_saves=%u); save '%s' cannot begin",
                   sd_esc(&eb, by), ghosts, per_peer, max, id);
  }
  if (!max || n < max) return 0;
  if (forget) {
    sd_lead_free(forget);
    return 0;
  }
  return sd_fail(err, SHARDD_E_LIMIT, "this daemon already leads %u multi-node saves (max_leader_saves=%u); "
                 "save '%s' cannot begin", n, max, id);
}

static const char *const lstate_names[] = {"collecting", "preparing", "writing", "finishing", "failed"};

void sd_lead_status(const sd_cluster *cl, json_t *arr) {
  for (const sd_lead *L = cl->leads; L; L = L->next) {
    size_t bytes = sizeof *L + L->nnodes * sizeof *L->nodes + (L->rank_node ? L->ws * sizeof *L->rank_node : 0);
    json_array_append_new(arr, json_pack("{s:o,s:s,s:i,s:i,s:i,s:I}", "save", sd_msg_string_lossy(L->id), "state",
                                         lstate_names[L->state], "nnodes", (json_int_t)L->nnodes, "joined",
                                         (json_int_t)L->njoined, "world_size", (json_int_t)L->ws, "memory_bytes",
                                         (json_int_t)bytes));
  }
}

unsigned sd_lead_active(const sd_cluster *cl) {
  unsigned n = 0;
  for (const sd_lead *L = cl->leads; L; L = L->next) n += L->state != L_FAILED;
  return n;
}

/* A join's total_parameters (a node's begin checked it), or -1 when its ranks gave none. */
static json_int_t join_total_parameters(json_t *h) {
  json_t *v = json_object_get(h, "total_parameters");
  return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

static int params_str(json_t *h, const char *f, const char **out) {
  *out = json_string_value(json_object_get(h, f));
  return *out ? 0 : -1;
}

sd_lead *sd_lead_new(sd_cluster *cl, const char *id, json_t *h, sd_error *err) {
  const char *dir, *prefix, *mode;
  uint64_t nn = 0, ws = 0, mss = 0;
  json_t *md = json_object_get(h, "metadata");
  if (params_str(h, "dir", &dir) || params_str(h, "prefix", &prefix) || params_str(h, "write_mode", &mode) ||
      sd_msg_u64(h, "nnodes", 1, SD_NNODES_MAX, &nn, err) < 0 || sd_msg_u64(h, "world_size", 1, SD_WORLD_MAX, &ws, err) < 0 ||
      sd_msg_u64(h, "max_shard_size", 1, 0, &mss, err) < 0 || nn < 2 || ws < nn || !json_is_object(md) ||
      sd_path_check_rel(dir, err) != 0) {
    sd_fail(err, SHARDD_E_INTERNAL, "save '%s': a malformed join", id);
    return NULL;
  }
  sd_lead *L = calloc(1, sizeof *L);
  if (!L) {
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory leading save '%s'", id);
    return NULL;
  }
  L->cl = cl;
  L->parent_fd = -1;
  L->id = strdup(id);
  L->dir = strdup(dir);
  L->prefix = strdup(prefix);
  L->mss = mss;
  L->ws = (uint32_t)ws;
  L->nnodes = (uint32_t)nn;
  L->overwrite = json_is_true(json_object_get(h, "overwrite"));
  L->keep_last = json_integer_value(json_object_get(h, "keep_last"));
  L->total_parameters = join_total_parameters(h);
  L->mode = !strcmp(mode, "shared") ? SD_WRITE_SHARED : SD_WRITE_OWNER;
  L->nodes = calloc(nn, sizeof *L->nodes);
  L->rank_node = malloc(ws * sizeof *L->rank_node);
  L->began = calloc(ws, 1);
  json_t *jt = json_object_get(h, "join_timeout");
  L->join_timeout = json_is_integer(jt) && json_integer_value(jt) >= 0 && json_integer_value(jt) <= SD_DEADLINE_MAX
                        ? (uint32_t)json_integer_value(jt)
                        : cl->d->cfg->join_timeout;
  L->nmd = json_object_size(md);
  L->md = calloc(L->nmd ? L->nmd : 1, sizeof *L->md);
  const sd_config *cfg = cl->d->cfg;
  L->file_mode = cfg->file_mode ? cfg->file_mode : 0644;
  L->dir_mode = cfg->dir_mode ? cfg->dir_mode : 0755;
  int bad = !L->id || !L->dir || !L->prefix || !L->nodes || !L->rank_node || !L->began || !L->md;
  size_t i = 0;
  const char *k;
  json_t *v;
  json_object_foreach(md, k, v) {
    if (bad) break;
    L->md[i].key = strdup(k);
    L->md[i].value = strdup(json_is_string(v) ? json_string_value(v) : "");
    bad = !L->md[i].key || !L->md[i].value;
    i++;
  }
  if (bad) {
    L->nmd = i;
    sd_lead_free(L);
    sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory leading save '%s'", id);
    return NULL;
  }
  for (uint32_t r = 0; r < ws; r++) L->rank_node[r] = -1;
  sd_cl_random_id(L->cid);
  L->state = L_COLLECT;
  L->next = cl->leads;
  cl->leads = L;
  cl->saves_led++;
  return L;
}

/* The first difference between a join and the save as the first node described it. */
int sd_lead_join_differs(const sd_lead *L, json_t *h, uint32_t k, sd_error *err) {
  const char *dir = json_string_value(json_object_get(h, "dir"));
  const char *prefix = json_string_value(json_object_get(h, "prefix"));
  const char *mode = json_string_value(json_object_get(h, "write_mode"));
  json_t *md = json_object_get(h, "metadata");
  json_int_t nn = json_integer_value(json_object_get(h, "nnodes"));
  json_int_t ws = json_integer_value(json_object_get(h, "world_size"));
  json_int_t mss = json_integer_value(json_object_get(h, "max_shard_size"));
  int ov = json_is_true(json_object_get(h, "overwrite"));
  if (nn != (json_int_t)L->nnodes)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives nnodes %lld, other nodes gave %u", L->id, k,
                   (long long)nn, L->nnodes);
  if (ws != (json_int_t)L->ws)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives world_size %lld, other nodes gave %u", L->id, k,
                   (long long)ws, L->ws);
  if (!dir || strcmp(dir, L->dir))
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives dir '%.200s', other nodes gave '%.200s'", L->id, k,
                   dir ? dir : "", L->dir);
  if (!prefix || strcmp(prefix, L->prefix))
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives prefix '%.100s', other nodes gave '%.100s'", L->id,
                   k, prefix ? prefix : "", L->prefix);
  if (mss != (json_int_t)L->mss)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives max_shard_size %lld, other nodes gave %llu",
                   L->id, k, (long long)mss, (unsigned long long)L->mss);
  json_int_t kl = json_integer_value(json_object_get(h, "keep_last"));
  if (kl != L->keep_last)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives keep_last %lld, other nodes gave %lld", L->id, k,
                   (long long)kl, (long long)L->keep_last);
  if (join_total_parameters(h) != L->total_parameters)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives total_parameters %lld, other nodes gave %lld "
                   "(-1: none)", L->id, k, (long long)join_total_parameters(h), (long long)L->total_parameters);
  if (ov != L->overwrite)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives overwrite %s, other nodes gave %s", L->id, k,
                   ov ? "true" : "false", L->overwrite ? "true" : "false");
  if (!mode || (strcmp(mode, "shared") == 0) != (L->mode == SD_WRITE_SHARED))
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives write_mode %s, other nodes gave %s", L->id, k,
                   mode ? mode : "?", L->mode == SD_WRITE_SHARED ? "shared" : "owner");
  int same = json_is_object(md) && json_object_size(md) == L->nmd;
  for (size_t i = 0; same && i < L->nmd; i++) {
    const char *v = json_string_value(json_object_get(md, L->md[i].key));
    same = v && strcmp(v, L->md[i].value) == 0;
  }
  if (!same)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': node %u gives different metadata than other nodes", L->id, k);
  return 0;
}

size_t sd_lead_done_cap(const sd_cluster *cl, const sd_peer *p) {
  /* Its files and checksum shares ([f, bytes] and [f, "8 hex"]) and the counters, per save it writes for. */
  size_t cap = 0;
  for (const sd_lead *L = cl->leads; L; L = L->next)
    for (uint32_t k = 0; L->state == L_WRITE && k < L->nnodes; k++)
      if (L->nodes[k].link == p && !L->nodes[k].done && 64 * L->nodes[k].nfiles > cap) cap = 64 * L->nodes[k].nfiles;
  return 4096 + cap;
}
