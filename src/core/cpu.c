/* CPU feature detection and ISA selection (cpuid through the compiler). */
#include "core/cpu.h"
#include "core/cgroup.h"
#include "ellm.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ellm_cpu_features g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;
static int g_cores[1024];
static int g_n_cores;
static int g_siblings[1024]; /* the other hardware threads of those cores, for more threads than cores */
static int g_n_siblings;

static int read_int_file(const char *path, int *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fscanf(f, "%d", out) == 1;
    fclose(f);
    return ok;
}

/* One logical CPU per physical core (the first sibling), among the CPUs this
 * process may run on. */
static void detect_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        g_cores[0] = 0;
        g_n_cores = 1;
        return;
    }
    int seen_pkg_core[1024][2];
    int n_seen = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE && g_n_cores < 1024; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        int core = cpu, pkg = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        read_int_file(path, &core);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        read_int_file(path, &pkg);
        int dup = 0;
        for (int i = 0; i < n_seen; i++)
            if (seen_pkg_core[i][0] == pkg && seen_pkg_core[i][1] == core) dup = 1;
        if (dup) {
            if (g_n_siblings < 1024) g_siblings[g_n_siblings++] = cpu;
            continue;
        }
        seen_pkg_core[n_seen][0] = pkg;
        seen_pkg_core[n_seen][1] = core;
        n_seen++;
        g_cores[g_n_cores++] = cpu;
    }
    if (g_n_cores == 0) {
        g_cores[0] = 0;
        g_n_cores = 1;
    }
}

static void detect(void) {
    __builtin_cpu_init();
    g_cpu.avx2 = __builtin_cpu_supports("avx2");
    g_cpu.fma = __builtin_cpu_supports("fma");
    g_cpu.f16c = 1; /* every AVX2 CPU shipped has F16C; checked below via cpuid */
    {
        unsigned a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
        g_cpu.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "Auth" "enti" "cAMD" */
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        g_cpu.f16c = (c >> 29) & 1;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
        g_cpu.avx512bf16 = (a >> 5) & 1;
    }
    g_cpu.avx512f = __builtin_cpu_supports("avx512f");
    g_cpu.avx512bw = __builtin_cpu_supports("avx512bw");
    g_cpu.avx512dq = __builtin_cpu_supports("avx512dq");
    g_cpu.avx512vl = __builtin_cpu_supports("avx512vl");
    g_cpu.avx512vnni = __builtin_cpu_supports("avx512vnni");
    g_cpu.avx512vbmi = __builtin_cpu_supports("avx512vbmi");
    g_cpu.best = ELLM_ISA_SCALAR;
    if (g_cpu.avx2 && g_cpu.fma && g_cpu.f16c) g_cpu.best = ELLM_ISA_AVX2;
    if (g_cpu.best == ELLM_ISA_AVX2 && g_cpu.avx512f && g_cpu.avx512bw && g_cpu.avx512dq &&
        g_cpu.avx512vl)
        g_cpu.best = ELLM_ISA_AVX512;
    g_cpu.active = g_cpu.best;
    const char *env = getenv("ELLM_ISA");
    if (env && *env) {
        ellm_isa want = g_cpu.best;
        if (!strcmp(env, "scalar")) want = ELLM_ISA_SCALAR;
        else if (!strcmp(env, "avx2")) want = ELLM_ISA_AVX2;
        else if (!strcmp(env, "avx512")) want = ELLM_ISA_AVX512;
        else fprintf(stderr, "eLLM: ignoring ELLM_ISA=%s (use scalar, avx2 or avx512)\n", env);
        if (want > g_cpu.best)
            fprintf(stderr, "eLLM: ELLM_ISA=%s is not supported by this CPU; using %s\n", env,
                    ellm_isa_str(g_cpu.best));
        else
            g_cpu.active = want;
    }
    detect_cores();
}

const ellm_cpu_features *ellm_cpu(void) {
    pthread_once(&g_cpu_once, detect);
    return &g_cpu;
}

ellm_isa ellm_cpu_isa(void) { return ellm_cpu()->active; }

int ellm_cpu_set_isa(ellm_isa isa) {
    ellm_cpu();
    if (isa > g_cpu.best) return 0;
    g_cpu.active = isa;
    return 1;
}

const char *ellm_isa_str(ellm_isa isa) {
    switch (isa) {
    case ELLM_ISA_SCALAR: return "scalar";
    case ELLM_ISA_AVX2: return "avx2";
    case ELLM_ISA_AVX512: return "avx512";
    }
    return "?";
}

const char *ellm_isa_name(void) { return ellm_isa_str(ellm_cpu_isa()); }

int ellm_cpu_physical_cores(void) {
    ellm_cpu();
    return g_n_cores;
}

int ellm_cpu_core_id(int i) {
    ellm_cpu();
    /* one thread per core first, then SMT siblings, then round again */
    if (i >= g_n_cores && g_n_siblings > 0) {
        int j = (i - g_n_cores) % (g_n_cores + g_n_siblings);
        return j < g_n_siblings ? g_siblings[j] : g_cores[j - g_n_siblings];
    }
    return g_cores[i % g_n_cores];
}

int ellm_default_threads(void) {
    /* a CPU quota (a container's --cpus, a service's CPUQuota) below the
     * cores: as many threads as it pays for, so none waits for a slice at
     * every barrier */
    const int cores = ellm_cpu_physical_cores();
    const double quota = cgroup_cpu_quota("");
    if (quota > 0 && quota < cores) return quota < 1 ? 1 : (int)quota;
    return cores;
}
