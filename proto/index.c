/* placeholder: index.c is being written. */
typedef int sd_placeholder_index_;
