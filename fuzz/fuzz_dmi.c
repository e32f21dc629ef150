/* libFuzzer target: a raw SMBIOS structure table (/sys/firmware/dmi/tables/DMI)
 * through dmi_parse_memory. Aborts on a sanitizer report or a broken
 * invariant: counts out of order, a failure without a message or with a
 * non-zeroed result, a negative or non-finite peak. Seeds: fuzz/corpus_dmi (the tables
 * tests/test_probe.c builds, written with ELLM_DMI_SEEDS=DIR). */
#include "topology/dmi.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond, what)                                               \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "invariant broken: %s (%s)\n", what, #cond);     \
            abort();                                                         \
        }                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dmi_memory m;
    ellm_error err = {0};
    ellm_status st = dmi_parse_memory(data, size, &m, &err);
    if (st != ELLM_OK) {
        FUZZ_CHECK(st == ELLM_ERR_FORMAT && err.msg[0], "a rejected table has a message");
        FUZZ_CHECK(m.n_slots == 0 && m.n_populated == 0, "a rejected table leaves a zeroed result");
        return 0;
    }
    FUZZ_CHECK(m.n_populated <= m.n_slots, "populated <= slots");
    FUZZ_CHECK(m.n_channels_populated <= m.n_channels && m.n_channels <= m.n_slots, "channels <= slots");
    FUZZ_CHECK(m.peak_gbps >= 0 && isfinite(m.peak_gbps) && m.full_peak_gbps >= m.peak_gbps, "peak");
    FUZZ_CHECK(m.speed_mts >= 0 && m.rated_mts >= 0, "speeds");
    (void)dmi_channels_known(&m);
    return 0;
}
