/* placeholder: reader.c is being written. */
typedef int sd_placeholder_reader_;
