/* What the process's cgroups allow (core/cgroup.c, core/meminfo.c), from
 * fake /proc and /sys trees: available memory for cgroup v2 (the
 * container's own root, nested cgroups with the limit on an ancestor, over
 * the limit), v1 and hybrid layouts, page cache left out of what a cgroup
 * holds; CPU quotas for v2 and v1; no information at all; then the real
 * system's figures. Then for real, in cgroups made here (as root; SKIP with
 * the reason elsewhere): a model whose interleaved copy would not fit a
 * memory cgroup loads in the file's layout and runs, and a one-CPU quota
 * gives one compute thread. */
#include "harness.h"

#include "core/cgroup.h"
#include "core/meminfo.h"

#include <errno.h>

static char root[600];

/* Writes text to root/path, making its folders. */
static void put(const char *path, const char *text) {
    char full[1200];
    snprintf(full, sizeof full, "%s%s", root, path);
    for (char *p = full + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(full, 0755);
        *p = '/';
    }
    FILE *f = fopen(full, "w");
    CHECK(f != NULL, "%s: %s", full, strerror(errno));
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void fresh(const char *tag) {
    char cmd[700];
    snprintf(root, sizeof root, "%.500s/meminfo_%s", test_tmp_dir(), tag);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "%s", cmd);
    mkdir(root, 0755);
}

#define GB ((uint64_t)1 << 30)
#define MB ((uint64_t)1 << 20)

static void expect(const char *what, int known, uint64_t avail, uint64_t limit) {
    ellm_meminfo mi;
    ellm_meminfo_at(root, &mi);
    CHECK(mi.known == known && (!known || mi.available == avail) && mi.cgroup_limit == limit,
          "%s: known %d available %llu limit %llu (want %d %llu %llu)", what, mi.known, (unsigned long long)mi.available,
          (unsigned long long)mi.cgroup_limit, known, (unsigned long long)avail, (unsigned long long)limit);
}

static int make_cgroup_why(const char *ctl, const char *v1_file, const char *v1_value, const char *v2_file,
                           const char *v2_value, char *dir, size_t cap, char *procs, size_t pcap, const char **why);

/* A cgroup of controller ctl ("memory", "cpu") for a child process, with
 * setting v1_file = v1_value (cgroup v1) or v2_file = v2_value (v2, when the
 * root's children have the controller): its folder in dir, the file to
 * write a pid into in procs. Returns 0 after printing "SKIP: what: why" if
 * it cannot be made here. */
static int make_cgroup(const char *what, const char *ctl, const char *v1_file, const char *v1_value,
                       const char *v2_file, const char *v2_value, char *dir, size_t cap, char *procs, size_t pcap) {
    const char *why = NULL;
    if (make_cgroup_why(ctl, v1_file, v1_value, v2_file, v2_value, dir, cap, procs, pcap, &why)) return 1;
    printf("SKIP: %s: %s\n", what, why);
    return 0;
}

static int make_cgroup_why(const char *ctl, const char *v1_file, const char *v1_value, const char *v2_file,
                           const char *v2_value, char *dir, size_t cap, char *procs, size_t pcap, const char **why) {
    char path[700];
    struct stat sb;
    if (geteuid() != 0) {
        *why = "not running as root (making a cgroup needs it)";
        return 0;
    }
    snprintf(path, sizeof path, "/sys/fs/cgroup/%s/%s", ctl, v1_file);
    int v1 = stat(path, &sb) == 0;
    char *sub = v1 ? NULL : test_read_file("/sys/fs/cgroup/cgroup.subtree_control", NULL);
    int v2 = sub && strstr(sub, ctl);
    free(sub);
    if (!v1 && !v2) {
        *why = "neither a cgroup v1 hierarchy with the controller nor a v2 one enabling it for the root's children";
        return 0;
    }
    if (v1) snprintf(dir, cap, "/sys/fs/cgroup/%s/ellm_test_%d", ctl, (int)getpid());
    else snprintf(dir, cap, "/sys/fs/cgroup/ellm_test_%s_%d", ctl, (int)getpid());
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        *why = "the cgroup folder cannot be made";
        return 0;
    }
    snprintf(path, sizeof path, "%s/%s", dir, v1 ? v1_file : v2_file);
    FILE *f = fopen(path, "w");
    int ok = f && fprintf(f, "%s\n", v1 ? v1_value : v2_value) > 0;
    if (f) ok &= fclose(f) == 0;
    if (!ok) {
        rmdir(dir);
        *why = "the cgroup's setting cannot be written";
        return 0;
    }
    snprintf(procs, pcap, "%s/cgroup.procs", dir);
    return 1;
}

/* The loader in a 64 MB memory cgroup with a 91 MB model (SmolLM2-135M's
 * shape in Q4_0): rewriting its matrices into private memory would exceed
 * the limit (a build without the check is killed by the cgroup's OOM
 * killer), so it keeps the file's layout, says why, and runs; outside the
 * cgroup the same file is interleaved. */
static void test_load_in_cgroup(void) {
    char dir[600], procs[700], model[700], cmd[2400], out[16384];
    if (!make_cgroup("loading under a memory cgroup limit", "memory", "memory.limit_in_bytes", "67108864",
                     "memory.max", "67108864", dir, sizeof dir, procs, sizeof procs))
        return;
    snprintf(model, sizeof model, "%s/meminfo_s135_q4_0.gguf", test_tmp_dir());
    snprintf(cmd, sizeof cmd, "%s synth --shape smollm2-135m --type q4_0 -o %s", test_ellm_bin(), model);
    int rc = test_shell(cmd, out, sizeof out);
    CHECK(rc == 0, "synth: %s", out);
    snprintf(cmd, sizeof cmd, "sh -c 'echo $$ > %s && exec %s run -m %s -n 2 -p hi --stats' 2>&1", procs,
             test_ellm_bin(), model);
    rc = test_shell(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "weights kept in the file's layout: interleaving them takes 0.09 GB") &&
              strstr(out, "(memory cgroup limit)") && strstr(out, "decode: 2 tokens"),
          "run in a 64 MB cgroup: exit %d\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -n 2 -p hi --stats 2>&1", test_ellm_bin(), model);
    rc = test_shell(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "matrices interleaved by 16 rows at load") && !strstr(out, "kept in the file's layout"),
          "run outside it: exit %d\n%s", rc, out);
    CHECK(rmdir(dir) == 0, "removing %s: %s", dir, strerror(errno));
    remove(model);
}

/* `ellm run --stats` under a one-CPU quota: one compute thread (the stats
 * line "threads: N"); outside it, one per core. */
static void test_threads_under_quota(void) {
    char dir[600], procs[700], cmd[1600], out[16384];
    if (!make_cgroup("threads under a CPU quota", "cpu", "cpu.cfs_quota_us", "100000", "cpu.max", "100000 100000",
                     dir, sizeof dir, procs, sizeof procs))
        return;
    snprintf(cmd, sizeof cmd, "sh -c 'echo $$ > %s && exec %s run -n 2 -p hi --stats' 2>&1", procs, test_ellm_bin());
    int rc = test_shell(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "threads: 1,"), "run under a one-CPU quota: exit %d\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "%s run -n 2 -p hi --stats 2>&1", test_ellm_bin());
    rc = test_shell(cmd, out, sizeof out);
    const char *t = strstr(out, "threads: ");
    const int outside = t ? atoi(t + 9) : 0;
    CHECK(rc == 0 && outside == ellm_default_threads() && outside >= 1, "run outside it: %d threads, exit %d\n%s",
          outside, rc, out);
    CHECK(rmdir(dir) == 0, "removing %s: %s", dir, strerror(errno));
}

/* A server asked for a 1 GB KV pool in a 64 MB memory cgroup starts (the
 * pool's pages are committed as sequences grow; its warm reserve and the
 * start's bandwidth test take at most an eighth of the memory available
 * each: at 64 MB apiece the previous build was killed before it was ready)
 * and says that a full pool may get it killed (SIGTERM after 4 s: it drains
 * and exits); outside, with gigabytes free, it does not warn. */
static void test_server_pool_warning(void) {
    char dir[600], procs[700], cmd[1600], out[16384];
    if (!make_cgroup("a server's KV pool under a memory cgroup limit", "memory", "memory.limit_in_bytes", "67108864",
                     "memory.max", "67108864", dir, sizeof dir, procs, sizeof procs))
        return;
    snprintf(cmd, sizeof cmd, "sh -c 'echo $$ > %s && exec timeout 4 %s serve -m models/evalmodel.gguf --port 0 -np 1 "
             "--kv-cache-gb 1' 2>&1", procs, test_ellm_bin());
    int rc = test_shell(cmd, out, sizeof out);
    CHECK(strstr(out, "ready:") && strstr(out, "warning: --kv-cache-gb 1 is more than the") &&
              strstr(out, "(memory cgroup limit): a full pool may get the server killed"),
          "server in a 64 MB cgroup with --kv-cache-gb 1: exit %d\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "timeout 4 %s serve -m models/evalmodel.gguf --port 0 -np 1 --kv-cache-gb 1 2>&1",
             test_ellm_bin());
    rc = test_shell(cmd, out, sizeof out);
    CHECK(strstr(out, "ready:") && !strstr(out, "warning:"), "server outside it: exit %d\n%s", rc, out);
    CHECK(rmdir(dir) == 0, "removing %s: %s", dir, strerror(errno));
}

static void expect_quota(const char *what, double want) {
    const double q = cgroup_cpu_quota(root);
    CHECK(fabs(q - want) < 1e-9, "%s: quota %g CPUs, want %g", what, q, want);
}

int main(void) {
    const char *meminfo = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    8388608 kB\n";

    fresh("none");
    expect("no /proc, no /sys", 0, 0, 0);

    fresh("plain");
    put("/proc/meminfo", meminfo);
    expect("MemAvailable only", 1, 8 * GB, 0);

    /* a container with its own cgroup namespace: 2 GB limit, 1 GB held of
     * which 512 MB is page cache ("file"; "file_mapped" is another key) */
    fresh("v2");
    put("/proc/meminfo", meminfo);
    put("/proc/self/cgroup", "0::/\n");
    put("/sys/fs/cgroup/memory.max", "2147483648\n");
    put("/sys/fs/cgroup/memory.current", "1073741824\n");
    put("/sys/fs/cgroup/memory.stat", "anon 536870912\nfile_mapped 4096\nfile 536870912\nkernel 0\n");
    expect("v2 container", 1, 2 * GB - 512 * MB, 2 * GB);

    /* nested: no limit on the process's cgroup, 1 GB on its parent holding 900 MB */
    fresh("v2nested");
    put("/proc/meminfo", meminfo);
    put("/proc/self/cgroup", "0::/a/b\n");
    put("/sys/fs/cgroup/a/b/memory.max", "max\n");
    put("/sys/fs/cgroup/a/b/memory.current", "104857600\n");
    put("/sys/fs/cgroup/a/memory.max", "1073741824\n");
    put("/sys/fs/cgroup/a/memory.current", "943718400\n");
    expect("v2 limit on an ancestor", 1, 1 * GB - 900 * MB, 1 * GB);

    /* over its limit: no headroom (not "unknown") */
    fresh("v2full");
    put("/proc/meminfo", meminfo);
    put("/proc/self/cgroup", "0::/\n");
    put("/sys/fs/cgroup/memory.max", "1073741824\n");
    put("/sys/fs/cgroup/memory.current", "1288490188\n");
    expect("v2 over its limit", 1, 0, 1 * GB);

    /* a limit above MemAvailable: MemAvailable is the smaller */
    fresh("v2big");
    put("/proc/meminfo", meminfo);
    put("/proc/self/cgroup", "0::/\n");
    put("/sys/fs/cgroup/memory.max", "68719476736\n");
    put("/sys/fs/cgroup/memory.current", "0\n");
    expect("v2 limit above the system's", 1, 8 * GB, 64 * GB);

    /* v1 beside a v2 hierarchy (hybrid): the memory controller's path has no
     * limit (2^63 rounded), its parent 3 GB with 1 GB held, all page cache */
    fresh("v1");
    put("/proc/meminfo", meminfo);
    put("/proc/self/cgroup", "9:memsomething:/z\n4:cpu,memory:/x/y\n3:cpuacct:/\n0::/\n");
    put("/sys/fs/cgroup/memory/x/y/memory.limit_in_bytes", "9223372036854771712\n");
    put("/sys/fs/cgroup/memory/x/y/memory.usage_in_bytes", "1073741824\n");
    put("/sys/fs/cgroup/memory/x/memory.limit_in_bytes", "3221225472\n");
    put("/sys/fs/cgroup/memory/x/memory.usage_in_bytes", "1073741824\n");
    put("/sys/fs/cgroup/memory/x/memory.stat", "cache 1073741824\ntotal_cache 1073741824\n");
    put("/sys/fs/cgroup/memsomething/z/memory.limit_in_bytes", "1\n"); /* not the memory controller */
    expect("v1 limit on an ancestor", 1, 3 * GB, 3 * GB);

    /* a v1 container without a cgroup namespace: the path /proc names is not
     * under the mount, whose root is the container's own cgroup */
    fresh("v1ns");
    put("/proc/meminfo", meminfo);
    put("/proc/self/cgroup", "5:memory:/docker/abc\n");
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "536870912\n");
    put("/sys/fs/cgroup/memory/memory.usage_in_bytes", "104857600\n");
    expect("v1 container's own root", 1, 512 * MB - 100 * MB, 512 * MB);

    /* CPU quotas */
    fresh("cpu_none");
    expect_quota("no cgroup files", 0);
    fresh("cpu_v2");
    put("/proc/self/cgroup", "0::/svc\n");
    put("/sys/fs/cgroup/svc/cpu.max", "150000 100000\n");
    expect_quota("v2 cpu.max 1.5 CPUs", 1.5);
    fresh("cpu_v2max");
    put("/proc/self/cgroup", "0::/svc\n");
    put("/sys/fs/cgroup/svc/cpu.max", "max 100000\n");
    expect_quota("v2 cpu.max max", 0);
    fresh("cpu_v2parent");
    put("/proc/self/cgroup", "0::/a/b\n");
    put("/sys/fs/cgroup/a/b/cpu.max", "800000 100000\n");
    put("/sys/fs/cgroup/a/cpu.max", "300000 100000\n");
    expect_quota("v2 the smaller quota of an ancestor", 3);
    fresh("cpu_v1");
    put("/proc/self/cgroup", "5:memory:/\n3:cpu,cpuacct:/k\n0::/\n");
    put("/sys/fs/cgroup/cpu,cpuacct/k/cpu.cfs_quota_us", "200000\n");
    put("/sys/fs/cgroup/cpu,cpuacct/k/cpu.cfs_period_us", "100000\n");
    put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
    put("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
    expect_quota("v1 under cpu,cpuacct", 2);
    fresh("cpu_v1none");
    put("/proc/self/cgroup", "3:cpu:/\n");
    put("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n");
    put("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n");
    expect_quota("v1 quota -1", 0);

    /* the real system: MemAvailable at least */
    ellm_meminfo mi;
    ellm_meminfo_get(&mi);
    CHECK(mi.known && mi.system > 0 && mi.available > 0 && mi.available <= mi.system, "this system: %d %llu %llu",
          mi.known, (unsigned long long)mi.available, (unsigned long long)mi.system);
    printf("this system: %.2f GB available (MemAvailable %.2f GB, cgroup limit %s)\n", mi.available / 1e9,
           mi.system / 1e9, mi.cgroup_limit ? "set" : "none");
    test_load_in_cgroup();
    test_threads_under_quota();
    test_server_pool_warning();
    return test_finish();
}
