/* placeholder: coverage.c is being written. */
typedef int sd_placeholder_coverage_;
