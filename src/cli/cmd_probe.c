/* `ellm probe`: what this machine offers for decode (ISA, topology, measured
 * read bandwidth per NUMA node, memory channels, huge pages) and advice. */
#include "cli/args.h"
#include "cli/commands.h"
#include "topology/probe.h"

#include <stdio.h>
#include <string.h>

static void probe_usage(FILE *f) {
    fprintf(f,
            "usage: ellm probe [--json] [--bw-mb MB] [--dmi FILE]\n"
            "  --json        machine-readable output\n"
            "  --bw-mb MB    buffer streamed per bandwidth measurement (default: 2x a node's L3,\n"
            "                at least 128)\n"
            "  --dmi FILE    read the SMBIOS table from FILE instead of /sys/firmware/dmi/tables/DMI\n");
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_json(const probe_report *r) {
    printf("{\"isa\": ");
    json_string(r->isa);
    printf(", \"logical_cpus\": %d, \"physical_cores\": %d, \"numa_nodes\": [", r->logical_cpus, r->physical_cores);
    for (int k = 0; k < r->n_nodes; k++) {
        const probe_node *n = &r->nodes[k];
        printf("%s{\"id\": %d, \"cpus\": [", k ? ", " : "", n->os_index);
        for (int i = 0; i < n->n_cpus; i++) printf("%s%d", i ? ", " : "", n->cpus[i]);
        printf("], \"memory_bytes\": %llu, \"read_gbps\": %.2f}", (unsigned long long)n->memory_bytes, n->read_gbps);
    }
    printf("], \"channels\": ");
    if (r->channels_known) {
        const dmi_memory *m = &r->dmi;
        printf("{\"slots\": %d, \"populated_slots\": %d, \"channels\": %d, \"populated_channels\": %d, \"type\": ",
               m->n_slots, m->n_populated, m->n_channels, m->n_channels_populated);
        json_string(m->type);
        printf(", \"speed_mts\": %d, \"rated_mts\": %d, \"data_width_bits\": %d, \"total_bytes\": %llu, "
               "\"peak_gbps\": %.2f}",
               m->speed_mts, m->rated_mts, m->data_width_bits, (unsigned long long)m->total_bytes, m->peak_gbps);
    } else {
        printf("null");
    }
    printf(", \"thp\": ");
    if (r->thp[0]) json_string(r->thp);
    else printf("null");
    printf(", \"limits\": {\"cpu_quota\": %.6g, \"default_threads\": %d, \"memory_limit_bytes\": %llu, "
           "\"memory_available_bytes\": %llu}",
           r->cpu_quota, r->default_threads, (unsigned long long)r->memory_limit,
           (unsigned long long)r->memory_available);
    printf(", \"advice\": [");
    for (int i = 0; i < r->n_advice; i++) {
        if (i) printf(", ");
        json_string(r->advice[i]);
    }
    printf("]}\n");
}

static void print_text(const probe_report *r) {
    printf("isa: %s\n", r->isa);
    printf("cpus: %d logical in this process's mask, %d physical cores, %d package%s, SMT %s\n", r->logical_cpus,
           r->physical_cores, r->n_packages, r->n_packages == 1 ? "" : "s", r->smt > 1 ? "on" : "off");
    printf("topology: %s\n", r->topology);
    for (int k = 0; k < r->n_nodes; k++) {
        const probe_node *n = &r->nodes[k];
        printf("node %d: %d cores, cpus", n->os_index, n->n_cores);
        for (int i = 0; i < n->n_cpus; i++) printf("%s%d", i ? "," : " ", n->cpus[i]);
        printf(", %.1f GB memory, read %.1f GB/s", n->memory_bytes / 1e9, n->read_gbps);
        if (n->remote_node >= 0) printf(", from node %d's memory %.1f GB/s", n->remote_node, n->remote_read_gbps);
        printf("\n");
    }
    printf("read bandwidth, all nodes: %.1f GB/s\n", r->all_read_gbps);
    if (r->channels_known) {
        const dmi_memory *m = &r->dmi;
        printf("memory: %s-%d, %d of %d slots, %d of %d channels populated, %.1f GB, peak %.1f GB/s\n",
               m->type[0] ? m->type : "DIMM", m->speed_mts, m->n_populated, m->n_slots, m->n_channels_populated,
               m->n_channels, m->total_bytes / 1e9, m->peak_gbps);
    } else {
        printf("memory channels: unknown (%s)\n", r->channels_why);
    }
    printf("transparent huge pages: %s\n", r->thp[0] ? r->thp : "unknown");
    printf("limits (cgroups): ");
    if (r->cpu_quota > 0) printf("CPU quota %.3g CPUs", r->cpu_quota);
    else printf("no CPU quota");
    if (r->memory_limit) printf(", memory %.2f GB (%.2f GB free)", r->memory_limit / 1e9, r->memory_available / 1e9);
    else printf(", no memory limit (%.2f GB available)", r->memory_available / 1e9);
    printf("; compute threads by default: %d\n", r->default_threads);
    printf("advice:\n");
    for (int i = 0; i < r->n_advice; i++) printf("  - %s\n", r->advice[i]);
    printf("(probe took %.0f ms)\n", r->elapsed_ms);
}

int cmd_probe(int argc, char **argv) {
    int json = 0, bad = 0;
    long bw_mb = 0;
    const char *dmi = NULL;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL, *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            probe_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) json = 1;
        else if (arg_value(argc, argv, &i, "--bw-mb", NULL, &v, &bad))
            bad = !v || !arg_int(a, v, 16, 1 << 16, &bw_mb);
        else if (arg_value(argc, argv, &i, "--dmi", NULL, &v, &bad)) dmi = v;
        else {
            fprintf(stderr, "error: unknown option '%s' (see ellm probe --help)\n", a);
            bad = 1;
        }
    }
    if (bad) return 2;
    static probe_report r;
    ellm_error err = {0};
    if (probe_run(&r, (size_t)bw_mb << 20, dmi, &err) != ELLM_OK) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    int kept = probe_cache_save(&r) == 0; /* for ellm run --stats and ellm bench */
    if (json) print_json(&r);
    else print_text(&r);
    if (!json && kept) printf("(all-node bandwidth kept for `ellm run --stats` and `ellm bench`)\n");
    probe_report_free(&r);
    return 0;
}
