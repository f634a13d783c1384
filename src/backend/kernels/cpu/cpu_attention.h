/* strata: the cpu attention kernels' shared code (kernels.c's causal
 * attention, kernels_llama.c's grouped-query one): one definition so both
 * compute a block with the same bits. */
#ifndef STRATA_CPU_ATTENTION_H
#define STRATA_CPU_ATTENTION_H

#include "strata/common.h"

#include "cpu_expf.h" /* st_expf() */

#include <stddef.h>
#include <stdint.h>

#define ST_ATT_BLOCK 64 /* query and key block of the attention */

/* The keys [*lo, *hi) of a tile (key block j0 of nj keys) that query
 * position t sees: causal (keys up to t) and, with a segment array, from
 * seg[t] on (the window position where t's document starts: packed
 * documents that do not attend across each other). lo >= hi: none. */
static inline void st_att_row_keys(int t, int j0, int nj, const int32_t *seg, int *lo,
				   int *hi)
{
	int h = t - j0 + 1;

	*hi = h < 0 ? 0 : ST_MIN(nj, h);
	*lo = seg && seg[t] > j0 ? ST_MIN(seg[t] - j0, nj) : 0;
}

/* The smallest segment start of query rows [i0, i0 + ni) (0 without
 * segments): key blocks wholly before it are skipped. */
static inline int st_att_seg_min(const int32_t *seg, int i0, int ni)
{
	int m = seg ? seg[i0] : 0;

	for (int r = 1; seg && r < ni; r++)
		m = seg[i0 + r] < m ? seg[i0 + r] : m;
	return m;
}

/* The online softmax over one (query block i0, key block j0) tile: s holds
 * the ni x nj scores (rows ST_ATT_BLOCK apart); each row r keeps the keys
 * it sees (st_att_row_keys(): its causal part, keys up to query i0 + r,
 * from its segment's start when seg is not NULL), is exponentiated against
 * the running max mrow[r] (raised to the tile's), summed into lrow[r], and
 * the rest zeroed, so s becomes the tile's probabilities; the output rows
 * o (o_stride apart, hd wide) already accumulated are rescaled to the new
 * max. A row that sees no key of the tile is zeroed and its max, sum and
 * output left as they are. */
static inline void st_att_online_softmax(float *s, int ni, int nj, int i0, int j0,
					 float *mrow, float *lrow, float *o, size_t o_stride,
					 int hd, const int32_t *seg)
{
	for (int r = 0; r < ni; r++) {
		float *sr = s + r * ST_ATT_BLOCK;
		int lo, nvalid;
		st_att_row_keys(i0 + r, j0, nj, seg, &lo, &nvalid);
		if (lo >= nvalid) {
			for (int c = 0; c < nj; c++)
				sr[c] = 0.0f;
			continue;
		}
		float mx = mrow[r];
		for (int c = lo; c < nvalid; c++)
			mx = sr[c] > mx ? sr[c] : mx;
		float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
		for (int c = lo; c < nvalid; c++) {
			sr[c] = st_expf(sr[c] - mx);
			sum += sr[c];
		}
		for (int c = 0; c < lo; c++)
			sr[c] = 0.0f;
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
 * code, each with its strides. seg: the row's T segment starts, or NULL
 * (causal over the whole row). */
void st_att_fwd_head(float *o, float *l_out, const float *q, const float *k, const float *v,
		     int T, int hd, int sq, int so, int sk, float scale, const int32_t *seg);
void st_att_bwd_head(float *dq, float *dk, float *dv, const float *dout, const float *q,
		     const float *k, const float *v, const float *o, const float *l_in, int T,
		     int hd, int sq, int so, int sk, float scale, const int32_t *seg);

#endif
