/* Deadlines no save outlives: ranks that never begin (join_timeout) and unsealed ranks gone silent (idle_timeout). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "save_int.h"

/* Half a second: a deadline is met at most this late, and an idle daemon wakes rarely. */
#define SD_DEADLINE_TICK_MS 500
/* Ranks named in a message; more are counted. */
#define SD_DEADLINE_NAMED 16

/* "ranks 1, 3" / "rank 2" / "ranks 0, 1, ... and 40 more", for the ranks with want(rank) set. */
static void rank_list(const sd_save *save, int (*want)(const sd_rank *), char *out, size_t n, uint32_t *count) {
  size_t k = 0;
  uint32_t c = 0;
  for (uint32_t r = 0; r < save->world_size; r++)
    if (want(&save->ranks[r])) c++;
  k += (size_t)snprintf(out, n, "%s", c == 1 ? "rank " : "ranks ");
  uint32_t shown = 0;
  for (uint32_t r = 0; r < save->world_size && k < n; r++) {
    if (!want(&save->ranks[r])) continue;
    if (shown == SD_DEADLINE_NAMED) {
      snprintf(out + k, n - k, " and %u more", c - shown);
      break;
    }
    k += (size_t)snprintf(out + k, n - k, "%s%u", shown ? ", " : "", r);
    shown++;
  }
  *count = c;
}

static int never_began(const sd_rank *rk) { return rk->state == SD_RANK_NONE; }
static int silent(const sd_rank *rk) { return rk->state == SD_RANK_BEGUN; }
static int sealed(const sd_rank *rk) { return rk->state == SD_RANK_SEALED; }

static void check_one(sd_save *save, uint64_t now) {
  char who[512], waiting[512];
  uint32_t n = 0, nw = 0;
  /* A multi-node save's ranks are spread over nodes: its leader keeps the join deadline over the nodes. */
  if (!save->cl && save->state == SD_SAVE_OPEN && save->join_timeout && save->nbegun < save->world_size &&
      now - save->t_begin / 1000000u >= (uint64_t)save->join_timeout * 1000u) {
    rank_list(save, never_began, who, sizeof who, &n);
    sd_save_fail(save, SHARDD_E_TIMEOUT, "save '%s': %s of %u never began within join_timeout %u s", save->id, who,
                 save->world_size, save->join_timeout);
    return;
  }
  /* Silent: begun, unsealed, and nothing from any rank (a sealed rank only waits). */
  if (save->state == SD_SAVE_FAILING || !save->idle_timeout || save->nsealed == save->nbegun) return;
  if (now - save->t_active_ms < (uint64_t)save->idle_timeout * 1000u) return;
  rank_list(save, silent, who, sizeof who, &n);
  rank_list(save, sealed, waiting, sizeof waiting, &nw);
  sd_save_fail(save, SHARDD_E_TIMEOUT, "save '%s': %s of %u sent nothing (put, file, declared, ready or seal) "
               "for idle_timeout %u s%s%s%s", save->id, who, save->world_size, save->idle_timeout,
               nw ? "; " : "", nw ? waiting : "", nw ? " sealed and waited" : "");
}

void sd_save_deadlines_check(sd_daemon *d) {
  size_t n = d->nsaves, k = 0;
  if (!n) return;
  sd_save **all = calloc(n, sizeof *all);
  if (!all) return;
  for (sd_save *s = d->saves; s && k < n; s = s->next) all[k++] = s;
  uint64_t now = sd_save_now_ms();
  /* Failing one save may end others' owners' callbacks: each is looked up again first. */
  for (size_t i = 0; i < k; i++)
    if (sd_save_alive(d, all[i]) && !all[i]->err.code) check_one(all[i], now);
  free(all);
}

static void on_tick(uv_timer_t *t) {
  sd_daemon *d = t->data;
  sd_save_deadlines_check(d);
  if (d->nsaves == 0) uv_timer_stop(t);
}

void sd_save_deadlines_arm(sd_daemon *d) {
  if (!d->loop || d->shutting_down) return;
  if (!d->deadline_ready) {
    if (uv_timer_init(d->loop, &d->deadline_timer) != 0) return;
    d->deadline_timer.data = d;
    /* Never what keeps the daemon running: shutdown ends saves by itself. */
    uv_unref((uv_handle_t *)&d->deadline_timer);
    d->deadline_ready = 1;
  }
  if (!uv_is_active((uv_handle_t *)&d->deadline_timer))
    uv_timer_start(&d->deadline_timer, on_tick, SD_DEADLINE_TICK_MS, SD_DEADLINE_TICK_MS);
}
