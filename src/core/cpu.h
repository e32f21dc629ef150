/* CPU features and the kernel ISA level chosen at run time. This table is the
 * only process-wide state in eLLM: it is filled once, on first use. */
#ifndef ELLM_CORE_CPU_H
#define ELLM_CORE_CPU_H

typedef enum {
    ELLM_ISA_SCALAR = 0, /* portable C reference */
    ELLM_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    ELLM_ISA_AVX512 = 2  /* AVX-512 F/BW/DQ/VL (+ VNNI, BF16 when present) */
} ellm_isa;

typedef struct {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512dq, avx512vl, avx512vnni, avx512bf16, avx512vbmi;
    int amd;         /* vendor AuthenticAMD (cpuid leaf 0): kernels whose memory tuning differs by vendor */
    ellm_isa best;   /* the best level this CPU runs */
    ellm_isa active; /* the level in use: best, or ELLM_ISA if lower */
} ellm_cpu_features;

/* Features of this CPU (detected once; thread-safe after the first call). */
const ellm_cpu_features *ellm_cpu(void);
/* The ISA in use. */
ellm_isa ellm_cpu_isa(void);
/* Forces an ISA level (tests). Returns 0 if this CPU cannot run it. */
int ellm_cpu_set_isa(ellm_isa isa);
const char *ellm_isa_str(ellm_isa isa);

/* Number of physical cores available to this process (>= 1), and the logical
 * CPU id of the first hyperthread of the i-th of them (for pinning); for i at
 * or past the core count, the cores' other hardware threads (SMT siblings). */
int ellm_cpu_physical_cores(void);
int ellm_cpu_core_id(int i);

#endif
