/* Shared-memory regions: client shm segments mapped read-only, refcounted so saves outlive detach and exit. */
#ifndef SD_REGION_H
#define SD_REGION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sd_error.h"

#define SD_SHM_NAME_MAX 255

typedef struct sd_region {
  unsigned refs;
  const uint8_t *base;
  uint64_t size;
  int fd;                  /* kept open, so a shrink after attach can be detected */
  int sealed;              /* a (tmpfs) memfd sealed with F_SEAL_SHRINK: its size can never drop,
                            * so its mapping is read with no shrink check, preadv or SIGBUS guard */
  int pin;                 /* 1 + its first buffer slot on the writer's ring (sealed only), 0: none */
  void (*unpin)(void *ctx, int pin, uint64_t len); /* called on the last reference */
  void *unpin_ctx;
  char name[SD_SHM_NAME_MAX + 1];
} sd_region;

/* Who attaches: the peer's credentials (SO_PEERCRED, SO_PEERGROUPS) and the
 * configured trusted group. */
typedef struct {
  uid_t uid;
  gid_t gid;
  const gid_t *groups;     /* supplementary groups of the peer */
  size_t ngroups;
  long trusted_gid;        /* -1: none */
} sd_region_peer;

/* Pure: may a peer attach a segment owned by owner_uid:owner_gid? Yes when
 * it owns it, or when the segment's group is the trusted group and the peer
 * is a member of it (primary or supplementary). */
int sd_region_may_attach(const sd_region_peer *p, uid_t owner_uid, gid_t owner_gid);

/* Opens POSIX shm `name` ("/x") read-only, checks the peer may attach it
 * (SHARDD_E_PERMISSION otherwise) and maps it. One reference. */
int sd_region_open(const char *name, const sd_region_peer *peer, sd_region **out, sd_error *err);
/* Takes over fd, a descriptor the client passed (SCM_RIGHTS): it must be a
 * memfd sealed with F_SEAL_SHRINK, regular and non-empty; then it is mapped.
 * The descriptor is the permission, so no owner check. fd is closed on
 * failure (SHARDD_E_INVALID_ARGUMENT naming it and what is wrong). */
int sd_region_adopt(int fd, sd_region **out, sd_error *err);
/* SHARDD_E_OUT_OF_RANGE naming the region when its segment is now shorter
 * than when it was mapped (the client shrank it): reading the missing pages
 * would fault. Always 0 for a sealed memfd, which cannot shrink. */
int sd_region_check(const sd_region *r, sd_error *err);
void sd_region_ref(sd_region *r);
/* Unmaps on the last reference. */
void sd_region_unref(sd_region *r);
/* Mappings alive in the process (for status). */
uint64_t sd_region_live(void);

/* ------------------------------------------------------------------------ *
 * A connection's region ids. Ids are never reused within a connection, so a
 * stale id cannot silently name a newer segment.
 * ------------------------------------------------------------------------ */
typedef struct {
  uint32_t id;
  sd_region *r;
} sd_region_slot;

typedef struct {
  sd_region_slot *v;
  size_t n, cap;
  uint32_t next_id;
} sd_region_table;

/* Takes over the caller's reference. */
int sd_region_table_add(sd_region_table *t, sd_region *r, uint32_t *id, sd_error *err);
sd_region *sd_region_table_get(const sd_region_table *t, uint64_t id);
/* Drops the table's reference; SHARDD_E_NO_SUCH_REGION when unknown. */
int sd_region_table_remove(sd_region_table *t, uint64_t id, sd_error *err);
void sd_region_table_clear(sd_region_table *t);

#endif
