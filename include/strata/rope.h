/* strata: rotary position embeddings' frequencies, as Hugging Face computes
 * them (transformers' modeling_rope_utils: "default", "linear", "llama3"),
 * shared by the cpu kernel, the cuda kernel (nvcc compiles it as host and
 * device code) and the tests, so every backend rotates by the same angles.
 *
 * Pair i of a head of hd channels (i < hd/2) rotates channels i and
 * i + hd/2 (rotate_half over split halves) by the angle pos * inv_freq(i):
 *   default  inv = 1 / theta^(2i/hd), in fp32 as torch does it;
 *   linear   inv / factor (the position divided by factor);
 *   llama3   wavelengths 2 pi / inv above original_ctx / low_freq_factor
 *            divided by factor, below original_ctx / high_freq_factor
 *            kept, in between smoothed between the two.
 * The angle is the fp32 product (float)pos * inv, and cos and sin are taken
 * in double of that fp32 angle and rounded to fp32. */
#ifndef STRATA_ROPE_H
#define STRATA_ROPE_H

#include <math.h>

#ifdef __CUDACC__
#define ST_ROPE_FN static inline __host__ __device__
#else
#define ST_ROPE_FN static inline
#endif

enum st_rope_type {
	ST_ROPE_DEFAULT = 0,
	ST_ROPE_LINEAR = 1,
	ST_ROPE_LLAMA3 = 2,
};

/* The inverse frequency of pair i of hd channels. */
ST_ROPE_FN float st_rope_inv_freq(int i, int hd, float theta, int type, float factor,
				  float low_freq_factor, float high_freq_factor,
				  int original_ctx)
{
	float e = (float)(2 * i) / (float)hd;
	float p = (float)pow((double)theta, (double)e);
	float inv = 1.0f / p;

	if (type == ST_ROPE_LINEAR)
		return inv / factor;
	if (type == ST_ROPE_LLAMA3) {
		const float two_pi = 6.283185307179586f;
		float low_wl = (float)original_ctx / low_freq_factor;
		float high_wl = (float)original_ctx / high_freq_factor;
		float wl = two_pi / inv;
		float scaled = wl > low_wl ? inv / factor : inv;
		if (!(wl < high_wl) && !(wl > low_wl)) {
			float s = ((float)original_ctx / wl - low_freq_factor) /
				  (high_freq_factor - low_freq_factor);
			scaled = (1.0f - s) * scaled / factor + s * scaled;
		}
		return scaled;
	}
	return inv;
}

/* cos and sin of position pos for pair i (see above). */
ST_ROPE_FN void st_rope_cos_sin(float inv, int pos, float *c, float *s)
{
	float a = (float)pos * inv;

	*c = (float)cos((double)a);
	*s = (float)sin((double)a);
}

#endif
