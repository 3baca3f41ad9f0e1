/* placeholder: checkpoint.c is being written. */
typedef int sd_placeholder_checkpoint_;
