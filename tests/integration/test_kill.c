/* A random-kill campaign with real processes: the daemon SIGKILLed at a random moment of each of many 2-4 rank saves and restarted on the same root, then single ranks SIGKILLed at random moments. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "ranks.h"
#include "xclient.h"

TestSuite(kill, .init = x_init, .fini = x_fini, .timeout = 170);

/* Small deadlines, so a save that lost a rank ends in seconds; the ranks' own waits have no
 * deadline (-1), so a hang would show as a rank that never exits. */
#define JOIN_S 2
#define IDLE_S 2
#define TEXT_(x) #x
#define TEXT(x) TEXT_(x)
static const char *const deadlines[] = {"--join-timeout", TEXT(JOIN_S), "--idle-timeout", TEXT(IDLE_S), NULL};
/* How long a rank may take after the daemon died or a rank was killed: the deadlines plus room for
 * a loaded machine. Only stops a hung test. */
#define RANK_BOUND_MS ((JOIN_S + IDLE_S) * 1000 + 20000)

static unsigned campaign_seed(void) {
  const char *env = getenv("SHARDD_KILL_SEED");
  unsigned seed = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
  printf("kill: seed %u (SHARDD_KILL_SEED=%u to replay the choices)\n", seed, seed);
  fflush(stdout);
  return seed;
}

/* A ~4 MiB BF16 Llama in ~5 shard files over world ranks at a random TP degree, sometimes streamed. */
static r_model pick_model(char *save, char *dir, int world, uint64_t seed) {
  int tps[3], ntp = 0;
  for (int t = 1; t <= world; t++)
    if (world % t == 0 && ntp < 3) tps[ntp++] = t;
  return (r_model){.hidden = 256, .layers = 2, .vocab = 1000, .inter = 688, .max_shard_size = 1 << 20,
                   .seed = seed, .world = world, .tp = tps[rand() % ntp], .dtype = "BF16", .save = save,
                   .dir = dir, .kill_rank = -1, .stream = rand() % 3 == 0};
}

/* Outcomes by name ("committed", or the error code a rank printed and the call that got it), in
 * order of first sight. */
typedef struct {
  char name[64];
  int n;
} tally;

static void count(tally *t, size_t cap, const char *name) {
  for (size_t i = 0; i < cap; i++) {
    if (!t[i].name[0]) snprintf(t[i].name, sizeof t[i].name, "%s", name);
    if (strcmp(t[i].name, name) == 0) {
      t[i].n++;
      return;
    }
  }
}

static void print_tally(const char *what, const tally *t, size_t cap) {
  printf("kill: %s:", what);
  for (size_t i = 0; i < cap && t[i].name[0]; i++) printf("%s %s %d", i ? "," : "", t[i].name, t[i].n);
  printf("\n");
}

/* One save's rank processes: spawned together, each reaped once with the time it ended. */
typedef struct {
  r_model m;
  pid_t pid[H_MAX_RANKS];
  int st[H_MAX_RANKS];
  int64_t started, ended[H_MAX_RANKS]; /* ended: 0 while it runs */
  char out[H_MAX_RANKS][PATH_MAX];
} ranks;

static void ranks_spawn(ranks *g, const r_model *m) {
  memset(g, 0, sizeof *g);
  g->m = *m;
  g->started = f_now_ms();
  for (int r = 0; r < m->world; r++) {
    snprintf(g->out[r], PATH_MAX, "%s/rank-%d.out", H.base, r);
    g->pid[r] = r_spawn(m, r, g->out[r]);
  }
}

/* Reaps whichever ranks have ended, until `until` (f_now_ms); returns how many still run. */
static int ranks_poll(ranks *g, int64_t until) {
  for (;;) {
    int running = 0;
    for (int r = 0; r < g->m.world; r++) {
      if (g->ended[r]) continue;
      if (waitpid(g->pid[r], &g->st[r], WNOHANG) == g->pid[r]) g->ended[r] = f_now_ms();
      else running++;
    }
    if (!running || f_now_ms() >= until) return running;
    f_sleep_ms(1);
  }
}

enum { R_FAILED, R_COMMITTED, R_EARLY /* failed before its begin: connect, arena */ };

/* Rank r, reaped (within RANK_BOUND_MS: a rank that never ends is a hang), must have exited 0
 * with its save committed or 1 having printed the error it got. Returns R_*; *talk_ms (may be
 * NULL) gets the time it spent in the save's calls, begin to the end of its wait. */
static int rank_outcome(ranks *g, int r, tally *t, size_t cap, int64_t *talk_ms) {
  if (!g->ended[r]) {
    g->st[r] = f_reap(g->pid[r], RANK_BOUND_MS);
    g->ended[r] = f_now_ms();
  }
  int st = g->st[r];
  json_t *j = r_line(g->out[r]);
  cr_assert_not_null(j, "rank %d (status 0x%x) printed no line: no error reached it", r, st);
  const char *state = json_string_value(json_object_get(j, "state"));
  const char *code = json_string_value(json_object_get(j, "error"));
  int committed = state && strcmp(state, "committed") == 0;
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == (committed ? 0 : 1), "rank %d ended 0x%x with state %s", r, st,
            state ? state : "?");
  cr_assert(committed || (code && *code), "rank %d failed without an error code", r);
  const char *step = committed ? "" : json_string_value(json_object_get(j, "step"));
  char key[64];
  snprintf(key, sizeof key, "%s%s%s", committed ? "committed" : code, committed ? "" : " in ", step);
  count(t, cap, key);
  int early = !strcmp(step, "connect") || !strcmp(step, "arena_create");
  if (talk_ms) {
    double sum = 0;
    static const char *const parts[] = {"begin_s", "puts_s", "seal_s", "wait_s"};
    for (int k = 0; k < 4; k++) sum += json_number_value(json_object_get(j, parts[k]));
    *talk_ms = (int64_t)(sum * 1000);
  }
  json_decref(j);
  return committed ? R_COMMITTED : early ? R_EARLY : R_FAILED;
}

/* When the last rank ended, from the spawn. */
static int64_t ranks_took(const ranks *g) {
  int64_t last = g->started;
  for (int r = 0; r < g->m.world; r++)
    if (g->ended[r] > last) last = g->ended[r];
  return last - g->started;
}

/* ------------------------------------------------------------------------ *
 * When to kill
 * ------------------------------------------------------------------------ */
/* How long a save of w ranks takes here, spawn to the last exit (span[w]), and the part of it
 * before the ranks speak to the daemon (lead: exec, the model's bytes, arenas, the example's
 * memcpy baselines). The machine's load changes both, so each kill corrects span[w]: one that
 * came after the save's end by the time the save took, one aimed past the lead that still found
 * a rank before its begin by stretching it. */
typedef struct {
  int64_t span[H_MAX_RANKS + 1];
  double lead;     /* of a span */
  int64_t talk;    /* ms from the first begin to the end of the last wait */
  int aimed_past;  /* the last moment was aimed past the lead */
} pace;

static void pace_learn(pace *p, int world, int ended_first, int64_t took, int found_early) {
  if (ended_first) p->span[world] = (p->span[world] + took) / 2;
  else if (found_early && p->aimed_past) p->span[world] += p->span[world] / 5;
}

/* Commits m; with p, every span (and the lead) from it. */
static void commit_model(const r_model *m, pace *p) {
  ranks g;
  tally t[4] = {{{0}, 0}};
  int64_t talk = 0;
  ranks_spawn(&g, m);
  for (int r = 0; r < m->world; r++) {
    int64_t ms;
    cr_assert_eq(rank_outcome(&g, r, t, 4, &ms), R_COMMITTED, "rank %d: the save failed", r);
    if (ms > talk) talk = ms;
  }
  int64_t span = ranks_took(&g);
  r_check_model(m);
  if (!p) return;
  for (int w = 0; w <= H_MAX_RANKS; w++) p->span[w] = span;
  p->lead = span > talk ? (double)(span - talk) / (double)span : 0;
  p->talk = talk;
}

/* Polls status until g's save is in flight (or every rank has ended); 1 when it was seen. */
static int await_begun(ranks *g) {
  x_conn *c = x_try_connect(H.sock);
  int seen = 0;
  for (int64_t until = f_now_ms() + RANK_BOUND_MS; c && !seen && f_now_ms() < until && ranks_poll(g, 0);) {
    json_t *r = x_call(c, "{\"op\":\"status\"}");
    json_t *v;
    size_t i;
    json_array_foreach(json_object_get(r, "saves"), i, v) {
      seen |= !strcmp(json_string_value(json_object_get(v, "save")), g->m.save);
    }
    json_decref(r);
    if (!seen) f_sleep_ms(1);
  }
  if (c) x_close(c);
  return seen;
}

/* Waits for a random moment of g's save, reaping the ranks that end meanwhile: one in five
 * before the ranks reach the daemon, two in five while they speak to it and it writes (up to
 * `end` thousandths of the span), two in five within the talk once the daemon holds the save
 * (puts, seal, the writes, fsyncs and the rename, whose moments a spawn-relative clock smears). */
static void await_random_moment(ranks *g, pace *p, int end) {
  int w = g->m.world, how = rand() % 5;
  int64_t lead = (int64_t)(p->lead * (double)p->span[w]), from = 0, to = lead;
  p->aimed_past = how != 0;
  if (how >= 3 && await_begun(g)) {
    int64_t ms = rand() % (int)(p->talk * end * 7 / 10000 + 1); /* the ranks' begins are spread over it too */
    ranks_poll(g, f_now_ms() + ms);
    return;
  }
  if (how) {
    from = lead;
    to = p->span[w] * end / 1000;
  }
  int64_t us = from * 1000 + (to > from ? rand() % (int)((to - from) * 1000) : 0);
  ranks_poll(g, g->started + us / 1000);
}

/* What is under the root: every folder holding files under a final name must pass the strict
 * reader; temporary folders are only counted (not entered). */
typedef struct {
  int checkpoints, tmp, del;
  size_t deep;             /* files whose recorded CRC-32C was checked against their bytes */
} scan_t;

static void scan(const char *path, int depth, scan_t *s) {
  DIR *d = opendir(path);
  cr_assert_not_null(d, "%s", path);
  int files = 0;
  for (struct dirent *de; (de = readdir(d));) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (!strncmp(de->d_name, ".shardd-tmp-", 12)) {
      s->tmp++;
      continue;
    }
    if (!strncmp(de->d_name, ".shardd-del-", 12)) {
      s->del++;
      continue;
    }
    char p[PATH_MAX];
    struct stat sb;
    int len = snprintf(p, sizeof p, "%s/%s", path, de->d_name);
    cr_assert(len > 0 && (size_t)len < sizeof p, "path too long under %s", path);
    cr_assert_eq(lstat(p, &sb), 0, "%s", p);
    if (S_ISDIR(sb.st_mode)) scan(p, depth + 1, s);
    else files++;
  }
  closedir(d);
  if (!files || depth == 0) return;
  sd_ckpt c;
  sd_error err;
  sd_error_clear(&err);
  int rc = sd_ckpt_read(path, &c, &err);
  cr_assert_eq(rc, 0, "%s is visible under its final name but the strict reader refuses it: %s: %s", path,
               sd_err_name(rc), err.msg);
  s->deep += h_ckpt_deep(path, &c); /* and its bytes are the ones its checksums were computed from */
  sd_ckpt_free(&c);
  s->checkpoints++;
}

static scan_t scan_root(void) {
  scan_t s = {0};
  scan(H.root, 0, &s);
  return s;
}

static uint64_t tree(const char *rel) {
  char p[PATH_MAX];
  return x_tree_hash(h_path(p, sizeof p, rel));
}

/* ------------------------------------------------------------------------ *
 * The daemon killed in each save
 * ------------------------------------------------------------------------ */
#define NOVER 3

Test(kill, daemon_sigkilled_at_random_moments_of_saves_from_2_to_4_ranks) {
  srand(campaign_seed());
  const int rounds = 50;
  x_start(deadlines);
  pace pc;
  r_model base = pick_model("base", "base", 4, 1);
  base.stream = 0;
  commit_model(&base, &pc); /* each round starts a fresh daemon, as this one is */
  int64_t ref_span = pc.span[4];
  uint64_t hbase = tree("base");
  /* checkpoints to overwrite, and what each holds */
  uint64_t over_seed[NOVER];
  static char osave[NOVER][32], odir[NOVER][32];
  for (int k = 0; k < NOVER; k++) {
    snprintf(osave[k], 32, "over-%d", k);
    snprintf(odir[k], 32, "over/%d", k);
    r_model m = pick_model(osave[k], odir[k], 2, 10 + (uint64_t)k);
    commit_model(&m, NULL);
    over_seed[k] = m.seed;
  }
  tally clients[24] = {{{0}, 0}};
  int published = 0, absent = 0, old_kept = 0, new_in = 0, after_end = 0, tmp_swept = 0, del_swept = 0, nranks = 0;
  size_t deep_checked = 0;
  int64_t slowest = 0;
  for (int i = 0; i < rounds; i++) {
    int kind = rand() % 4; /* 0, 1: a new folder; 2: overwrite; 3: a new folder with keep_last */
    int k = rand() % NOVER;
    char save[64], dir[64];
    snprintf(save, sizeof save, "camp-%d", i);
    if (kind == 2) snprintf(dir, sizeof dir, "over/%d", k);
    else snprintf(dir, sizeof dir, "%s/%d", kind == 3 ? "kept" : "new", i);
    r_model m = pick_model(save, dir, 2 + rand() % 3, 100 + (uint64_t)i);
    m.overwrite = kind == 2;
    m.keep_last = kind == 3 ? 2 : 0;
    ranks g;
    ranks_spawn(&g, &m);
    await_random_moment(&g, &pc, 1150);
    int ended_first = ranks_poll(&g, 0) == 0;
    int64_t killed_at = f_now_ms();
    kill(H.pid, SIGKILL);
    x_reap_killed();
    int said_committed = 0, found_early = 0;
    for (int r = 0; r < m.world; r++) {
      int o = rank_outcome(&g, r, clients, 24, NULL);
      said_committed += o == R_COMMITTED;
      found_early |= o == R_EARLY;
    }
    nranks += m.world;
    pace_learn(&pc, m.world, ended_first, ranks_took(&g), found_early);
    after_end += ended_first;
    if (!ended_first && ranks_took(&g) - (killed_at - g.started) > slowest)
      slowest = ranks_took(&g) - (killed_at - g.started);

    /* what the kill left, before anything cleans up */
    scan_t s = scan_root();
    tmp_swept += s.tmp;
    del_swept += s.del;
    deep_checked += s.deep;
    cr_assert_eq(tree("base"), hbase, "round %d: a checkpoint committed before changed", i);
    char p[PATH_MAX];
    int present = h_exists(h_path(p, sizeof p, dir));
    cr_assert(!said_committed || present, "round %d: a rank heard committed but %s is absent", i, dir);
    if (kind == 2) {
      r_model old = m;
      old.seed = over_seed[k];
      int is_new = r_holds_seed(&m, dir);
      cr_assert(!said_committed || is_new, "round %d: a rank heard committed but %s holds the old save", i, dir);
      r_check_model(is_new ? &m : &old);
      if (is_new) {
        over_seed[k] = m.seed;
        new_in++;
      } else {
        old_kept++;
      }
    } else if (present) {
      r_check_model(&m);
      published++;
    } else {
      absent++;
    }

    /* a restarted daemon on the same root sweeps the temporary folders */
    x_start(deadlines);
    s = scan_root();
    cr_assert_eq(s.tmp + s.del, 0, "round %d: %d temporary and %d deletion folders survive a restart", i, s.tmp,
                 s.del);
  }
  x_serving();
  cr_assert_gt(deep_checked, 0, "no folder's checksums were checked");
  printf("kill: %d saves from 2-4 ranks (%d rank processes), %d daemon kills at random moments (a 4-rank save "
         "took %lld ms, %.0f%% of it before the ranks reach the daemon; %d kills came after the save's end), "
         "%d restarts on the same root\n",
         rounds, nranks, rounds, (long long)ref_span, pc.lead * 100, after_end, rounds);
  printf("kill: folders after the kills: %d new published whole, %d new absent, %d overwrites swapped in whole, "
         "%d overwrites kept the old checkpoint, none partial (strict reader, shardctl verify, every byte; %zu "
         "files' recorded CRC-32C checked against their bytes)\n",
         published, absent, new_in, old_kept, deep_checked);
  print_tally("what the ranks heard", clients, 24);
  printf("kill: swept on restart: %d .shardd-tmp-* and %d .shardd-del-* folders; the slowest rank ended %lld ms "
         "after the kill\n",
         tmp_swept, del_swept, (long long)slowest);
}

/* ------------------------------------------------------------------------ *
 * One rank killed in each save
 * ------------------------------------------------------------------------ */
Test(kill, a_rank_sigkilled_at_random_moments_fails_the_others_within_their_deadline) {
  srand(campaign_seed() + 1);
  const int rounds = 20;
  x_start(deadlines);
  r_model ref = pick_model("ref", "ref", 4, 1);
  ref.stream = 0;
  commit_model(&ref, NULL);
  /* this daemon keeps running: time a save once it is warm (staging, pinned arenas) */
  ref.save = ref.dir = "ref2";
  pace pc;
  commit_model(&ref, &pc);
  tally others[24] = {{{0}, 0}};
  int kills = 0, ended_first = 0, published = 0, absent = 0;
  int64_t slowest = 0;
  for (int i = 0; i < rounds; i++) {
    char save[64], dir[64];
    snprintf(save, sizeof save, "rk-%d", i);
    snprintf(dir, sizeof dir, "rk/%d", i);
    r_model m = pick_model(save, dir, 2 + rand() % 3, 200 + (uint64_t)i);
    int victim = rand() % m.world;
    ranks g;
    ranks_spawn(&g, &m);
    await_random_moment(&g, &pc, 950);
    int64_t killed_at = f_now_ms();
    if (!g.ended[victim]) {
      kill(g.pid[victim], SIGKILL);
      g.st[victim] = f_reap(g.pid[victim], RANK_BOUND_MS);
      g.ended[victim] = f_now_ms();
      kills++;
    } else {
      ended_first++;
    }
    int committed = 0, found_early = 0;
    for (int r = 0; r < m.world; r++) {
      if (r == victim) continue;
      int o = rank_outcome(&g, r, others, 24, NULL);
      committed += o == R_COMMITTED;
      found_early |= o == R_EARLY;
      int64_t took = g.ended[r] - killed_at;
      cr_assert_leq(took, (JOIN_S + IDLE_S) * 1000 + 10000, "round %d: rank %d ended %lld ms after the kill", i, r,
                    (long long)took);
      if (took > slowest) slowest = took;
    }
    pace_learn(&pc, m.world, g.ended[victim] < killed_at, ranks_took(&g), found_early);
    /* one outcome for the save: every other rank committed (the victim had sealed), or none did */
    cr_assert(committed == 0 || committed == m.world - 1, "round %d: %d of %d ranks committed", i, committed,
              m.world - 1);
    char p[PATH_MAX];
    if (committed) {
      r_check_model(&m);
      published++;
    } else {
      cr_assert(!h_exists(h_path(p, sizeof p, dir)), "round %d: %s was published after a failed save", i, dir);
      absent++;
    }
    scan_root();
  }
  /* the failed saves' temporary folders go once their writes are cancelled */
  h_await_no_tmp();
  cr_assert_eq(h_tmp_count(), 0, "a failed save left its temporary folder");
  x_serving();
  printf("kill: %d saves from 2-4 ranks, %d rank kills at random moments (%d times the victim had already ended), "
         "join_timeout %d s, idle_timeout %d s\n",
         rounds, kills, ended_first, JOIN_S, IDLE_S);
  printf("kill: %d saves committed (the victim had sealed), %d failed with nothing published; the slowest other "
         "rank ended %lld ms after the kill\n",
         published, absent, (long long)slowest);
  print_tally("what the other ranks heard", others, 24);
}
