/* Test-only crash and fault points in the publish path: inert unless SHARDD_TEST_CRASH_AT or SHARDD_TEST_FAULT is set. */
#ifndef SD_CRASHPOINT_H
#define SD_CRASHPOINT_H

#include <stdint.h>

/* ------------------------------------------------------------------------ *
 * Compiled into every build so the fault tests exercise the real daemon,
 * but each call costs one branch unless the variable is set. Phases (see
 * publish_start.c, publish_job.c, fileset.c and docs/formats.md, "What shardd promises"):
 *
 *   start       temporary folder and files created and sized, nothing written
 *   write       a data/header/artifact/index write completed
 *   fsync       a file's fsync completed
 *   index       the index file's write, then its fsync, completed
 *   dirsync     the temporary folder's fsync completed (before the rename)
 *   rename      the rename to ROOT/DIR happened (before the parent's fsync)
 *   parentsync  the parent's fsync completed (before the save is reported)
 *   filejob     a node's share of a multi-node save: its file set started
 *               (crash, stall), and each of its writes' answers (fault)
 *   filejob_write  a write of that file set completed (crash, stall)
 *   filejob_mixed  a node's own bytes written into a block shared with
 *                  forwarded ones, before they are read again (crash, stall)
 *   lead        the same for the leader's own files (artifacts, index),
 *               fsyncs included
 *   lead_prepare    the leader made the temporary folder and sized its
 *                   files, before any node is assigned (crash, stall)
 *   lead_index      every node reported its files durable, the leader's
 *                   own not yet written
 *   lead_rename     the leader renamed the folder in, before the parent's
 *                   fsync
 *   lead_parentsync the parent's fsync done, before the nodes are told
 *   fence       a node that lost the leader after its done moves the
 *               temporary folder away (fault: the rename's answer)
 *
 * SHARDD_TEST_CRASH_AT=PHASE:N  the N-th time PHASE is reached (counted over
 *                               the daemon's life, from 1) the daemon kills
 *                               itself with SIGKILL, as `kill -9` would.
 * SHARDD_TEST_FAULT=PHASE:N:ERR the N-th completion of PHASE (write or fsync)
 *                               reports -ERR (a number, or EIO, ENOSPC) instead
 *                               of what the kernel said; once.
 * SHARDD_TEST_STALL_AT=PHASE:N:MS the N-th time PHASE is reached the daemon
 *                               sleeps MS milliseconds (its loop stopped).
 * ------------------------------------------------------------------------ */
void sd_crash_point(const char *phase);
/* res, or -errno when the fault is due at this completion of phase. */
int sd_fault_point(const char *phase, int res);
/* The same for a write that can report how far it got: *half is set when
 * the test asks that its first half went out before the error
 * (SHARDD_TEST_FAULT=PHASE:N:ERR:half), so a resumed write is exercised. */
int sd_fault_point_part(const char *phase, int res, int *half);
/* SHARDD_TEST_GATHER_MIN_PIECE=BYTES, else def: the smallest row fragment
 * gathered (pubfill.c); the tests gather small rows to exercise the path. */
uint64_t sd_test_gather_min_piece(uint64_t def);

#endif
