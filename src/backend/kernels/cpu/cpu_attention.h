/* strata: the cpu attention kernels' shared code (kernels.c's causal
 * attention, kernels_llama.c's grouped-query one): one definition so both
 * compute a block with the same bits. */
#ifndef STRATA_CPU_ATTENTION_H
#define STRATA_CPU_ATTENTION_H

#include "strata/common.h"

#include "cpu_expf.h" /* st_expf() */

#include <stddef.h>

#define ST_ATT_BLOCK 64 /* query and key block of the attention */

/* The online softmax over one (query block i0, key block j0) tile: s holds
 * the ni x nj scores (rows ST_ATT_BLOCK apart); each row r keeps its causal
 * part (keys up to query i0 + r), is exponentiated against the running max
 * mrow[r] (raised to the tile's), summed into lrow[r], and the rest zeroed,
 * so s becomes the tile's probabilities; the output rows o (o_stride apart,
 * hd wide) already accumulated are rescaled to the new max. */
static inline void st_att_online_softmax(float *s, int ni, int nj, int i0, int j0,
					 float *mrow, float *lrow, float *o, size_t o_stride,
					 int hd)
{
	for (int r = 0; r < ni; r++) {
		float *sr = s + r * ST_ATT_BLOCK;
		int nvalid = i0 + r - j0 + 1;
		nvalid = nvalid < 0 ? 0 : ST_MIN(nj, nvalid);
		float mx = mrow[r];
		for (int c = 0; c < nvalid; c++)
			mx = sr[c] > mx ? sr[c] : mx;
		float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
		for (int c = 0; c < nvalid; c++) {
			sr[c] = st_expf(sr[c] - mx);
			sum += sr[c];
		}
		for (int c = nvalid; c < nj; c++)
			sr[c] = 0.0f;
		float alpha = st_expf(mrow[r] - mx);
		lrow[r] = lrow[r] * alpha + sum;
		mrow[r] = mx;
		if (alpha != 1.0f) {
			float *orow = o + (size_t)(i0 + r) * o_stride;
			for (int d = 0; d < hd; d++)
				orow[d] *= alpha;
		}
	}
}

/* One (batch, head) of the causal attention, forward and backward
 * (kernels.c): GPT-2's attention and the grouped-query one run the same
 * code, each with its strides. */
void st_att_fwd_head(float *o, float *l_out, const float *q, const float *k, const float *v,
		     int T, int hd, int sq, int so, int sk, float scale);
void st_att_bwd_head(float *dq, float *dk, float *dv, const float *dout, const float *q,
		     const float *k, const float *v, const float *o, const float *l_in, int T,
		     int hd, int sq, int so, int sk, float scale);

#endif
