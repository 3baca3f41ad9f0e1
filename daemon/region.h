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
  char name[SD_SHM_NAME_MAX + 1];
} sd_region;

/* Opens POSIX shm `name` ("/x") read-only, checks its owner is `uid`
 * (SHARDD_E_PERMISSION otherwise) and maps it. One reference. */
int sd_region_open(const char *name, uid_t uid, sd_region **out, sd_error *err);
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
