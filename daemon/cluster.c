/* Multi-node saves, the plumbing: start-up, begin fields, message routing between roles, peer loss, status. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster.h"
#include "cluster_int.h"
#include "log.h"
#include "pathsafe.h"
#include "publish.h"
#include "rootlock.h"
#include "sd_msg.h"

/* ------------------------------------------------------------------------ *
 * Node names and temporary folders
 * ------------------------------------------------------------------------ */
static void node_name_of(const sd_config *cfg, char *out, size_t n) {
  if (cfg->node_name && *cfg->node_name) {
    snprintf(out, n, "%s", cfg->node_name);
    return;
  }
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
  snprintf(out, n, "%s", host);
}

int sd_cluster_claim_root(const sd_config *cfg, int root_fd, int *lock_fd, sd_error *err) {
  int peers = cfg->peer_listen && *cfg->peer_listen;
  char node[SD_PEER_NAME_MAX + 1], tag[SD_PEER_NAME_MAX + 32];
  node_name_of(cfg, node, sizeof node);
  /* Held before the sweep: what it removes belongs to no live daemon. */
  int rc = sd_root_lock(root_fd, cfg->root, peers ? node : NULL, lock_fd, err);
  if (rc) return rc;
  sd_error e = {0};
  if (!peers) {
    rc = sd_cleanup_stale(root_fd, &e);
  } else {
    sd_cl_tmp_tag(node, tag, sizeof tag);
    rc = sd_cleanup_stale_owned(root_fd, tag, &e);
  }
  if (rc) sd_log_warn("cleaning stale temporary folders: %s", e.msg);
  return 0;
}

/* ------------------------------------------------------------------------ *
 * Local delivery between this daemon's participant and its leader
 * ------------------------------------------------------------------------ */
static void drain_local(uv_idle_t *h) {
  sd_cluster *cl = h->data;
  /* Only what is queued now: handlers may queue more for the next turn. */
  sd_lmsg *m = cl->lq;
  cl->lq = NULL;
  cl->lqtail = &cl->lq;
  uv_idle_stop(&cl->lq_idle);
  cl->lq_active = 0;
  while (m) {
    sd_lmsg *next = m->next;
    if (cl->shutting) {
      json_decref(m->hdr);
      free(m->payload);
    } else if (m->to_lead) {
      sd_lead_on_msg(cl, NULL, m->hdr, m->payload, m->plen);
    } else {
      sd_node_on_leader_msg(cl, NULL, m->hdr, m->payload, m->plen);
    }
    free(m);
    m = next;
  }
}

/* ------------------------------------------------------------------------ *
 * Peer events
 * ------------------------------------------------------------------------ */
static void on_frame(sd_peer_net *net, sd_peer *p, json_t *hdr, uint8_t *payload, size_t plen) {
  sd_cluster *cl = sd_peer_net_ud(net);
  const char *t = json_string_value(json_object_get(hdr, "t"));
  if (!t) t = "";
  if (!strcmp(t, "data")) {
    sd_node_on_data(cl, p, hdr, payload, plen);
    return;
  }
  if (!strcmp(t, "ack")) {
    sd_node_on_ack(cl, p, hdr);
    json_decref(hdr);
    free(payload);
    return;
  }
  if (!strcmp(t, "join") || !strcmp(t, "began") || !strcmp(t, "manifest") || !strcmp(t, "table") ||
      !strcmp(t, "fail") || !strcmp(t, "done")) {
    /* Nodes speak to their leader on the connection they opened to it. */
    if (sd_peer_is_outgoing(p)) {
      sd_log_warn("peer %s: '%.40s' on a connection this daemon opened; ignored", sd_peer_addr(p), t);
      json_decref(hdr);
      free(payload);
      return;
    }
    sd_lead_on_msg(cl, p, hdr, payload, plen);
    return;
  }
  if (!strcmp(t, "assign") || !strcmp(t, "commit") || !strcmp(t, "abort") || !strcmp(t, "send_table")) {
    sd_node_on_leader_msg(cl, p, hdr, payload, plen);
    return;
  }
  /* Newer peers may send more kinds; ignoring them keeps versions compatible. */
  sd_log_debug("peer %s: ignoring message '%.40s'", sd_peer_addr(p), t);
  json_decref(hdr);
  free(payload);
}

/* What each kind of frame may weigh from this peer now (PEERS.md, "Frame sizes"): a function of
 * the saves that expect it from that peer, so a frame larger than its kind's is refused unread. */
static int frame_cap(sd_peer_net *net, sd_peer *p, const char *t, size_t *header_max, size_t *payload_max,
                     sd_error *err) {
  (void)err;
  sd_cluster *cl = sd_peer_net_ud(net);
  const sd_config *cfg = cl->d->cfg;
  if (!strcmp(t, "data")) {
    *payload_max = SD_FWD_FRAME; /* runs (at most SD_FWD_RUNS) fit the control size */
  } else if (!strcmp(t, "join")) {
    /* Its fields but the metadata fit the control size; the metadata (and dir) came in a begin line,
     * re-encoded no longer than they were there, and must equal what this daemon's own ranks give
     * in lines of at most max_line, and fit a shard's header (max_header). */
    uint64_t md = cfg ? (cfg->max_line < cfg->max_header ? cfg->max_line : cfg->max_header) : 0;
    *header_max = md < SD_PEER_HEADER_MAX - SD_PEER_CONTROL_MAX ? SD_PEER_CONTROL_MAX + md : SD_PEER_HEADER_MAX;
  } else if (!strcmp(t, "manifest")) {
    *header_max = sd_lead_manifest_cap(cl, p, 0);
  } else if (!strcmp(t, "table")) {
    *header_max = sd_lead_manifest_cap(cl, p, 1);
  } else if (!strcmp(t, "done")) {
    *header_max = sd_lead_done_cap(cl, p);
  } else if (!strcmp(t, "assign")) {
    size_t cap = sd_node_assign_cap(cl, p, payload_max);
    *header_max = cap ? cap : SD_PEER_CONTROL_MAX;
  }
  return 0;
}

static void on_lost(sd_peer_net *net, sd_peer *p, int code, const char *why) {
  sd_cluster *cl = sd_peer_net_ud(net);
  if (cl->shutting) return;
  sd_log_info("peer connection %s %s ended: %s", sd_peer_is_outgoing(p) ? "to" : "from", sd_peer_describe(p), why);
  sd_lead_peer_lost(cl, p, code, why);
  sd_node_peer_lost(cl, p, code, why);
}

static void on_lead_tick(uv_timer_t *t) { sd_lead_tick(t->data); }

/* ------------------------------------------------------------------------ *
 * Start and stop
 * ------------------------------------------------------------------------ */
int sd_cluster_init(sd_daemon *d, sd_error *err) {
  const sd_config *cfg = d->cfg;
  if (!cfg->peer_listen || !*cfg->peer_listen) {
    if (cfg->peer_token_file && *cfg->peer_token_file)
      sd_log_warn("peer_token_file is set but peer_listen is not: multi-node saves stay off");
    return 0;
  }
  if (!cfg->peer_token_file || !*cfg->peer_token_file)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "--peer-listen needs --peer-token-file: peers must prove they share a secret");
  uint8_t *token = NULL;
  size_t tlen = 0;
  int rc = sd_peer_token_load(cfg->peer_token_file, &token, &tlen, err);
  if (rc) return rc;
  sd_cluster *cl = calloc(1, sizeof *cl);
  if (!cl) {
    free(token);
    return sd_fail(err, SHARDD_E_NO_MEMORY, "out of memory for peer networking");
  }
  cl->d = d;
  cl->lqtail = &cl->lq;
  node_name_of(cfg, cl->node, sizeof cl->node);
  sd_cl_tmp_tag(cl->node, cl->tmp_tag, sizeof cl->tmp_tag);
  {
    sd_peer_opts o = {.listen = cfg->peer_listen,
                      .node_name = cl->node,
                      .token = token,
                      .token_len = tlen,
                      .timeout_ms = (uint64_t)(cfg->peer_timeout ? cfg->peer_timeout : 30) * 1000,
                      .handshake_ms = (uint64_t)cfg->peer_handshake_timeout * 1000,
                      .max_unauth = cfg->peer_max_unauth,
                      /* Strangers stop twice as early as local clients, so the Unix socket keeps room too. */
                      .fd_reserve = 2 * cfg->fd_reserve};
    sd_peer_handlers h = {.on_frame = on_frame, .on_lost = on_lost, .frame_cap = frame_cap};
    rc = sd_peer_net_init(&cl->net, d->loop, &o, &h, cl, err);
  }
  memset(token, 0, tlen);
  free(token);
  if (rc) {
    free(cl);
    return rc;
  }
  uv_idle_init(d->loop, &cl->lq_idle);
  cl->lq_idle.data = cl;
  /* The leader's join deadlines; never what keeps the daemon running. */
  uv_timer_init(d->loop, &cl->lead_timer);
  cl->lead_timer.data = cl;
  uv_unref((uv_handle_t *)&cl->lead_timer);
  uv_timer_start(&cl->lead_timer, on_lead_tick, SD_LEAD_TICK_MS, SD_LEAD_TICK_MS);
  cl->lq_drain = drain_local;
  d->cluster = cl;
  sd_log_info("listening for peer daemons on %s as node '%s' (peer timeout %u s)",
              sd_peer_net_listen_addr(cl->net), cl->node, cfg->peer_timeout);
  return 0;
}

static void on_idle_closed(uv_handle_t *h) {
  sd_cluster *cl = h->data;
  cl->idle_closed++;
  sd_cl_maybe_free(cl);
}

void sd_cluster_shutdown(sd_daemon *d) {
  sd_cluster *cl = d->cluster;
  if (!cl || cl->shutting) return;
  sd_lead_shutdown(cl);
  cl->shutting = 1;
  sd_peer_net_close(cl->net);
  for (sd_lmsg *m = cl->lq; m;) {
    sd_lmsg *next = m->next;
    json_decref(m->hdr);
    free(m->payload);
    free(m);
    m = next;
  }
  cl->lq = NULL;
  while (cl->failed) {
    sd_cfailed *f = cl->failed;
    cl->failed = f->next;
    sd_cl_failed_free(f);
  }
  d->cluster = NULL;
  uv_close((uv_handle_t *)&cl->lq_idle, on_idle_closed);
  uv_close((uv_handle_t *)&cl->lead_timer, on_idle_closed);
}

/* ------------------------------------------------------------------------ *
 * begin
 * ------------------------------------------------------------------------ */
int sd_cluster_parse_begin(const json_t *req, sd_begin_args *a, sd_error *err) {
  uint64_t nn = 1, nr = 0;
  const char *leader = NULL, *mode = NULL;
  int has_nn = sd_msg_u64(req, "nnodes", 0, SD_NNODES_MAX, &nn, err);
  if (has_nn < 0) return err->code;
  int has_nr = sd_msg_u64(req, "node_rank", 0, SD_NNODES_MAX, &nr, err);
  if (has_nr < 0) return err->code;
  if (sd_msg_str(req, "leader", 0, &leader, NULL, err) < 0) return err->code;
  if (sd_msg_str(req, "write_mode", 0, &mode, NULL, err) < 0) return err->code;
  if (has_nn && nn == 0) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'nnodes' must be at least 1");
  a->nnodes = (uint32_t)nn;
  a->node_rank = (uint32_t)nr;
  a->leader = leader;
  a->write_mode = SD_WRITE_OWNER;
  if (mode && !strcmp(mode, "shared")) a->write_mode = SD_WRITE_SHARED;
  else if (mode && strcmp(mode, "owner") != 0)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'write_mode' must be \"owner\" or \"shared\", got '%.40s'",
                   mode);
  if (nn <= 1) {
    if (nr != 0)
      return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'node_rank' is %llu but 'nnodes' is 1",
                     (unsigned long long)nr);
    return 0;
  }
  if (!has_nr)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'node_rank' is required when 'nnodes' is more than 1");
  if (nr >= nn)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'node_rank' is %llu, outside [0, nnodes=%llu)",
                   (unsigned long long)nr, (unsigned long long)nn);
  if (!leader)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "field 'leader' (HOST:PORT of node 0's peer listener) is required when 'nnodes' is more than 1");
  char host[SD_PEER_ADDR_MAX];
  unsigned port;
  if (sd_peer_addr_split(leader, host, sizeof host, &port, err) != 0) {
    char why[SD_ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", err->msg);
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'leader': %s", why);
  }
  if (port == 0) return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "field 'leader': port 0 is not a listener");
  return 0;
}

static int sd_cluster_begin_new(sd_save *save, const sd_begin_args *a, sd_csave **out, sd_error *err) {
  sd_cluster *cl = save->d->cluster;
  if (!cl)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT,
                   "save '%s' spans %u nodes, but this daemon does not listen for peers (start it with "
                   "--peer-listen and --peer-token-file)", a->save, a->nnodes);
  if (a->world_size < a->nnodes)
    return sd_fail(err, SHARDD_E_INVALID_ARGUMENT, "save '%s': world_size %u is smaller than nnodes %u", a->save,
                   a->world_size, a->nnodes);
  sd_cfailed **pp = sd_cl_failed_find(cl, a->save);
  if (pp) {
    sd_cfailed *f = *pp;
    if (a->rank < f->world_size && !f->began[a->rank]) {
      *err = f->err;
      return err->code;
    }
    *pp = f->next; /* a retry: the old attempt is forgotten */
    sd_cl_failed_free(f);
  }
  return sd_node_begin(save, a, out, err);
}

static const char *mode_name(int m) { return m == SD_WRITE_SHARED ? "shared" : "owner"; }

static int sd_cluster_begin_check(const sd_save *save, const sd_begin_args *a, sd_error *err) {
  const sd_csave *cs = save->cl;
  uint32_t nn = a->nnodes ? a->nnodes : 1;
  if (!cs) {
    if (nn > 1)
      return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives nnodes %u, earlier ranks gave 1", save->id,
                     a->rank, nn);
    return 0;
  }
  if (nn != cs->nnodes)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives nnodes %u, earlier ranks gave %u", save->id,
                   a->rank, nn, cs->nnodes);
  if (a->node_rank != cs->node_rank)
    return sd_fail(err, SHARDD_E_CONFLICT,
                   "save '%s': rank %u gives node_rank %u, earlier ranks on this daemon gave %u", save->id, a->rank,
                   a->node_rank, cs->node_rank);
  if (!a->leader || strcmp(a->leader, cs->leader) != 0)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives leader '%.100s', earlier ranks gave '%.100s'",
                   save->id, a->rank, a->leader ? a->leader : "", cs->leader);
  if ((sd_write_mode)a->write_mode != cs->mode)
    return sd_fail(err, SHARDD_E_CONFLICT, "save '%s': rank %u gives write_mode %s, earlier ranks gave %s",
                   save->id, a->rank, mode_name(a->write_mode), mode_name(cs->mode));
  return 0;
}

/* ------------------------------------------------------------------------ *
 * The hooks a multi-node save carries (save.h's sd_save_ext_ops)
 * ------------------------------------------------------------------------ */
static void sd_cluster_sealed(sd_save *save) { sd_node_sealed(save->cl); }
static void sd_cluster_began(sd_save *save, uint32_t rank) {
  sd_node_to_leader(save->cl, json_pack("{s:s,s:I}", "t", "began", "rank", (json_int_t)rank));
}
static int sd_cluster_fail(sd_save *save) { return sd_node_fail(save->cl); }
static void sd_cluster_save_free(sd_save *save) {
  sd_node_free(save->cl);
}

static void sd_cluster_result(const sd_save *save, uint64_t *files, uint64_t *tensors, uint64_t *bytes) {
  const sd_csave *cs = save->cl;
  *files = cs->r_files;
  *tensors = cs->r_tensors;
  *bytes = cs->r_bytes;
}

static uint64_t sd_cluster_bytes_written(const sd_save *save) { return save->cl->bytes_written; }
static uint64_t sd_cluster_bytes_zero_copy(const sd_save *save) { return save->cl->bytes_zero_copy; }
static uint64_t sd_cluster_bytes_forwarded(const sd_save *save) { return save->cl->bytes_fwd; }

const sd_save_ext_ops sd_cluster_save_ext = {
    .attach = sd_cluster_begin_new,
    .join_check = sd_cluster_begin_check,
    .began = sd_cluster_began,
    .sealed = sd_cluster_sealed,
    .fail = sd_cluster_fail,
    .detach = sd_cluster_save_free,
    .result = sd_cluster_result,
    .bytes_written = sd_cluster_bytes_written,
    .bytes_zero_copy = sd_cluster_bytes_zero_copy,
    .bytes_forwarded = sd_cluster_bytes_forwarded,
};

/* ------------------------------------------------------------------------ *
 * Status
 * ------------------------------------------------------------------------ */
void sd_cluster_status_save(const sd_save *save, json_t *o) {
  const sd_csave *cs = save->cl;
  json_object_set_new(o, "nnodes", json_integer(cs->nnodes));
  json_object_set_new(o, "node_rank", json_integer(cs->node_rank));
  json_object_set_new(o, "leader", sd_msg_string_lossy(cs->leader));
  json_object_set_new(o, "write_mode", json_string(mode_name(cs->mode)));
  json_object_set_new(o, "bytes_local", json_integer((json_int_t)cs->bytes_local));
  json_object_set_new(o, "bytes_forwarded", json_integer((json_int_t)cs->bytes_fwd));
  json_object_set_new(o, "bytes_received", json_integer((json_int_t)cs->bytes_recv));
}

void sd_cluster_status(sd_daemon *d, json_t *m) {
  sd_cluster *cl = d->cluster;
  if (!cl) return;
  json_t *p = json_object();
  json_object_set_new(p, "node", sd_msg_string_lossy(cl->node));
  json_object_set_new(p, "listen", sd_msg_string_lossy(sd_peer_net_listen_addr(cl->net)));
  json_object_set_new(p, "connections", json_integer(sd_peer_net_count(cl->net)));
  json_object_set_new(p, "connections_unauthenticated", json_integer(sd_peer_net_unauth_count(cl->net)));
  json_object_set_new(p, "saves_leading", json_integer(sd_lead_active(cl)));
  json_object_set_new(p, "saves_led", json_integer((json_int_t)cl->saves_led));
  json_t *leading = json_array();
  sd_lead_status(cl, leading);
  json_object_set_new(p, "leader_saves", leading);
  json_object_set_new(p, "max_leader_saves", json_integer(d->cfg ? d->cfg->max_leader_saves : 0));
  json_object_set_new(p, "bytes_local", json_integer((json_int_t)cl->bytes_local));
  json_object_set_new(p, "bytes_forwarded", json_integer((json_int_t)cl->bytes_fwd));
  json_object_set_new(p, "bytes_received", json_integer((json_int_t)cl->bytes_recv));
  json_object_set_new(p, "net_bytes_sent", json_integer((json_int_t)sd_peer_net_bytes_sent(cl->net)));
  json_object_set_new(p, "net_bytes_received", json_integer((json_int_t)sd_peer_net_bytes_received(cl->net)));
  json_object_set_new(m, "peers", p);
}

int sd_cluster_save_leads(const sd_save *save) { return !save->cl || save->cl->is_leader; }
