/* Test-only crash and fault points: SHARDD_TEST_CRASH_AT kills the daemon at a chosen step of a save, SHARDD_TEST_FAULT fakes an I/O error. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crashpoint.h"

typedef struct {
  int parsed, armed;
  char phase[32];
  unsigned long at, hits;
  int err;
  int half;                /* SHARDD_TEST_FAULT's ":half": the write's first half went out before the error */
} point;

static point crash, fault, stall;

/* "PHASE:N" or "PHASE:N:ERR" (the fault point also "PHASE:N:ERR:half"); anything malformed leaves the point inert. */
static void parse(point *p, const char *var, int want_err) {
  p->parsed = 1;
  const char *v = getenv(var);
  if (!v || !*v) return;
  const char *colon = strchr(v, ':');
  if (!colon || (size_t)(colon - v) >= sizeof p->phase) return;
  memcpy(p->phase, v, (size_t)(colon - v));
  p->phase[colon - v] = '\0';
  char *end;
  p->at = strtoul(colon + 1, &end, 10);
  if (p->at == 0) return;
  if (want_err) {
    if (*end != ':') return;
    char e[16];
    snprintf(e, sizeof e, "%s", end + 1);
    char *half = strstr(e, ":half");
    if (half && !half[5]) p->half = 1, *half = '\0';
    if (!strcmp(e, "EIO")) p->err = EIO;
    else if (!strcmp(e, "ENOSPC")) p->err = ENOSPC;
    else if (!strcmp(e, "EINVAL")) p->err = EINVAL;
    else p->err = atoi(e);
    if (p->err <= 0) return;
  } else if (*end) {
    return;
  }
  p->armed = 1;
  fprintf(stderr, "shardd: %s=%s is set (test build hook)\n", var, v);
}

static int due(point *p, const char *var, int want_err, const char *phase) {
  if (!p->parsed) parse(p, var, want_err);
  if (!p->armed || strcmp(p->phase, phase) != 0) return 0;
  return ++p->hits == p->at;
}

void sd_crash_point(const char *phase) {
  if (due(&stall, "SHARDD_TEST_STALL_AT", 1, phase)) {
    /* the whole daemon stops for a moment, so a test can act in between */
    fprintf(stderr, "shardd: stall point %s:%lu reached: sleeping %d ms\n", phase, stall.at, stall.err);
    usleep((useconds_t)stall.err * 1000);
  }
  if (!due(&crash, "SHARDD_TEST_CRASH_AT", 0, phase)) return;
  fprintf(stderr, "shardd: crash point %s:%lu reached: SIGKILL\n", phase, crash.at);
  kill(getpid(), SIGKILL);
  _exit(137); /* not reached */
}

int sd_fault_point(const char *phase, int res) {
  return sd_fault_point_part(phase, res, NULL);
}

int sd_fault_point_part(const char *phase, int res, int *half) {
  if (half) *half = 0;
  if (!due(&fault, "SHARDD_TEST_FAULT", 1, phase)) return res;
  fprintf(stderr, "shardd: fault point %s:%lu reached: reporting %s%s\n", phase, fault.at, strerror(fault.err),
          fault.half && half ? " after half of the write" : "");
  if (half) *half = fault.half;
  return -fault.err;
}

uint64_t sd_test_gather_min_piece(uint64_t def) {
  const char *v = getenv("SHARDD_TEST_GATHER_MIN_PIECE");
  return v && *v ? strtoull(v, NULL, 10) : def;
}
