/* Memory channels from the SMBIOS (DMI) table: the type 17 "Memory Device"
 * records the firmware writes for every DIMM slot.
 *
 * Linux exposes the raw structure table as /sys/firmware/dmi/tables/DMI
 * (readable by root only). Each structure is a 4-byte header (type, length of
 * the formatted area, handle), the formatted area, then a set of
 * NUL-terminated strings closed by an empty one; type 127 ends the table.
 * The parser treats the table as hostile: every offset is checked against the
 * buffer and a record that runs past it is an error naming the offset. */
#ifndef ELLM_TOPOLOGY_DMI_H
#define ELLM_TOPOLOGY_DMI_H

#include "ellm.h"

#include <stddef.h>
#include <stdint.h>

#define DMI_MAX_CHANNELS 64

typedef struct {
    int n_slots;             /* type 17 records (DIMM slots) */
    int n_populated;         /* slots with a module installed */
    int n_channels;          /* distinct channels over all slots (from the locators) */
    int n_channels_populated;/* channels with at least one module */
    int speed_mts;           /* slowest configured speed of the installed modules (MT/s; 0: unknown) */
    int rated_mts;           /* fastest rated speed of the installed modules (MT/s; 0: unknown) */
    int data_width_bits;     /* data width of one module (64 for a DDR4/DDR5 DIMM) */
    char type[12];           /* "DDR4", "DDR5", ... or "" */
    uint64_t total_bytes;    /* installed capacity */
    double peak_gbps;        /* populated channels x speed x width: the theoretical read bandwidth */
    double full_peak_gbps;   /* the same with every channel populated */
    int virtual_table;       /* 1: the table describes a virtual machine's memory (no real channels) */
} dmi_memory;

/* Parses `len` bytes of a raw SMBIOS structure table into *out. A table
 * without type 17 records gives ELLM_OK with n_slots = 0. Malformed input
 * (a header or formatted area past the end, a length below 4, a string set
 * without its terminator) gives ELLM_ERR_FORMAT with the offset in err.
 * Safe on untrusted input. */
ellm_status dmi_parse_memory(const uint8_t *table, size_t len, dmi_memory *out, ellm_error *err);

/* Reads and parses `path` (NULL: /sys/firmware/dmi/tables/DMI). ELLM_ERR_IO
 * when the file is absent or unreadable (not root). */
ellm_status dmi_read_memory(const char *path, dmi_memory *out, ellm_error *err);

/* 1 if the result describes real channels worth reporting: readable, some
 * module installed with a known speed, not a virtual machine's table. */
int dmi_channels_known(const dmi_memory *m);

#endif
