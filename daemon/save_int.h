/* What the save core's files (save_request.c, save_end.c, save_store.c, save_deadline.c) share and nobody above them sees. */
#ifndef SD_SAVE_INT_H
#define SD_SAVE_INT_H

#include "save.h"

/* A new save from a's fields (copied), in no table yet; NULL when out of memory. */
sd_save *sd_save_new(sd_daemon *d, const sd_begin_args *a);
/* Lets go of everything the save holds, the multi-node part included. */
void sd_save_free(sd_save *save);
/* Out of the daemon's table: its id is free for a new save. */
void sd_save_unlink(sd_daemon *d, sd_save *save);
/* Keeps r (its strings taken over) for late waits, dropping the oldest past keep_results. */
void sd_save_history_push(sd_daemon *d, sd_save_result *r);

/* Monotonic milliseconds, the clock of the deadlines. */
uint64_t sd_save_now_ms(void);
/* A rank of the save did something: the idle deadline starts over. */
void sd_save_touch(sd_save *save);
/* A save was created: the deadline timer runs while saves are in flight. */
void sd_save_deadlines_arm(sd_daemon *d);

#endif
