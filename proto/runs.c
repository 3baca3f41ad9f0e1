/* placeholder: runs.c is being written. */
typedef int sd_placeholder_runs_;
