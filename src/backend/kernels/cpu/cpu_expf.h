/* strata: the cpu kernels' exp (kernels.c, kernels_llama.c): one
 * definition so every kernel exponentiates with the same bits. */
#ifndef STRATA_CPU_EXPF_H
#define STRATA_CPU_EXPF_H

#include <stdint.h>

/* exp(x) in fp32 written so the compiler can vectorise it (glibc's expf is
 * a scalar call). n = round(x / ln2), r = x - n ln2 (Cody-Waite split),
 * exp(r) by a degree-7 Taylor polynomial (|r| <= ln2/2: error < 1e-8),
 * times 2^n built in the exponent bits. Within 2 ulp of expf; returns 0
 * below -87 (where expf is near FLT_MIN) and saturates above 88. NaN gives
 * NaN: the upper clamp is written so a NaN fails its test and becomes 88,
 * so n stays in range (a NaN converted to int32 and shifted is undefined
 * behaviour), and the last line puts the NaN back. Every other input gives
 * the bits it always did. */
static inline float st_expf(float x)
{
	float xc = x < 88.0f ? x : 88.0f;
	xc = xc < -87.0f ? -87.0f : xc;
	/* 1.5 * 2^23: adding and subtracting it rounds to nearest integer */
	float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
	float r = xc - n * 0.693359375f;
	r = r + n * 2.12194440e-4f;
	float p = 1.0f / 5040.0f;
	p = p * r + 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	union {
		int32_t i;
		float f;
	} s;
	s.i = ((int32_t)n + 127) << 23;
	float y = p * s.f;
	y = x < -87.0f ? 0.0f : y;
	return x != x ? x : y;
}

#endif
