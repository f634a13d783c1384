/* strata: which vector ISA the cpu kernels' elementwise loops run with
 * (kernels.c). Only loops whose every element is computed alone (no
 * reduction, no fma: the kernels are built with -ffp-contract=off) have
 * wider variants, so the ISA changes how many elements one instruction
 * holds, never a bit of the result; the reductions (sums over a row) keep
 * the one baseline loop whatever the ISA. tests/model/test_kernels.c runs
 * every variant this cpu has against the baseline, bit for bit. */
#ifndef STRATA_CPU_ISA_H
#define STRATA_CPU_ISA_H

enum st_cpu_isa {
	ST_CPU_ISA_BASE,   /* the build's baseline (SSE2 on x86-64) */
	ST_CPU_ISA_AVX2,   /* 8 floats an instruction */
	ST_CPU_ISA_AVX512, /* 16 (AVX-512F) */
};

/* The ISA in use: the widest this cpu has, unless st_cpu_isa_set() chose. */
enum st_cpu_isa st_cpu_isa(void);

/* Use isa (tests), or the widest the cpu has below it; returns the one now
 * in use. Not for use while kernels run on other threads. */
enum st_cpu_isa st_cpu_isa_set(enum st_cpu_isa isa);

const char *st_cpu_isa_name(enum st_cpu_isa isa);

#endif
