/* strata: `strata plan`'s text (st_plan_print(), st_plan_print_units()),
 * and the helpers its JSON (plan_json.c) shares. */
#include "plan_internal.h"

#include <string.h>

const char *st_plan_fmt_bytes(uint64_t bytes, char *buf)
{
	return st_format_bytes(bytes, buf, 32);
}

/* Units and bytes of state s in tier h. */
void st_plan_count(const struct st_plan *p, enum st_state s, enum st_home h,
	      int *units, uint64_t *bytes)
{
	*units = 0;
	*bytes = 0;
	for (int u = 0; u < p->units; u++)
		if (st_plan_home(p, u, s) == h) {
			(*units)++;
			*bytes += p->state_bytes[u * ST_STATE_COUNT + s];
		}
}

/* The units of state s in tier h as ranges ("0-19, 22"), or "" for none. */
void st_plan_unit_ranges(const struct st_plan *p, enum st_state s, enum st_home h, char *buf,
		    size_t n)
{
	size_t len = 0;

	buf[0] = 0;
	for (int u = 0; u < p->units; u++) {
		int v = u;

		if (st_plan_home(p, u, s) != h)
			continue;
		while (v + 1 < p->units && st_plan_home(p, v + 1, s) == h)
			v++;
		if (len < n)
			len += (size_t)snprintf(buf + len, n - len, "%s%d", len ? ", " : "", u);
		if (v > u && len < n)
			len += (size_t)snprintf(buf + len, n - len, "-%d", v);
		u = v;
	}
}

/* Does state s have a home in more than one tier? */
static bool state_split(const struct st_plan *p, enum st_state s)
{
	for (int u = 1; u < p->units; u++)
		if (st_plan_home(p, u, s) != st_plan_home(p, 0, s))
			return true;
	return false;
}

/* The split placement by unit, one line per group of states with the same
 * homes: "    G, P     host 0-19; nvme 20-47". */
static void print_split(const struct st_plan *p, FILE *f)
{
	bool done[ST_STATE_COUNT] = { false }, any = false;
	char r[512];

	for (int s = 0; s < ST_STATE_COUNT; s++)
		any |= state_split(p, (enum st_state)s);
	if (!any)
		return;
	fprintf(f, "  by unit (the split placement)\n");
	for (int s = 0; s < ST_STATE_COUNT; s++) {
		char names[32];
		size_t len;
		bool first = true;

		if (done[s] || !state_split(p, (enum st_state)s))
			continue;
		len = (size_t)snprintf(names, sizeof(names), "%s", st_state_name((enum st_state)s));
		for (int t = s + 1; t < ST_STATE_COUNT; t++) {
			bool same = true;

			for (int u = 0; u < p->units && same; u++)
				same = st_plan_home(p, u, (enum st_state)t) ==
				       st_plan_home(p, u, (enum st_state)s);
			if (same) {
				done[t] = true;
				len += (size_t)snprintf(names + len, sizeof(names) - len, ", %s",
							st_state_name((enum st_state)t));
			}
		}
		fprintf(f, "    %-11s", names);
		for (int h = 0; h < ST_HOME_COUNT; h++) {
			st_plan_unit_ranges(p, (enum st_state)s, (enum st_home)h, r, sizeof(r));
			if (!r[0])
				continue;
			fprintf(f, "%s%s %s", first ? "" : "; ", st_home_name((enum st_home)h), r);
			first = false;
		}
		fputc('\n', f);
	}
}

static const char *fmt_s(double s, char *buf, size_t n)
{
	if (s < 1e-3)
		snprintf(buf, n, "%.1f us", s * 1e6);
	else if (s < 1)
		snprintf(buf, n, "%.2f ms", s * 1e3);
	else
		snprintf(buf, n, "%.3f s", s);
	return buf;
}

const char *st_plan_rate_source(const struct st_plan *p, enum st_rate i)
{
	return st_rate_source_name((enum st_rate_source)p->rates.source[i]);
}

/* A cores' rate's source: not given, it is the copy rate. */
static const char *cores_source(const struct st_plan *p, enum st_rate i)
{
	return p->rates.source[i] == ST_RATE_SRC_DEFAULT ? "the copy rate" : st_plan_rate_source(p, i);
}

/* The vram checkpoint line of `strata plan`: where they live. */
static void act_print(const struct st_plan *p, FILE *f)
{
	char a[32], b[32], c[32];

	if (p->act_home != ST_HOME_HOST) {
		fprintf(f, "        checkpoints     %s (%d x %s; activations in vram)\n",
			st_plan_fmt_bytes(p->act_bytes, a), p->units - 1, st_plan_fmt_bytes(p->act_each_bytes, b));
		return;
	}
	fprintf(f, "        checkpoints     %s (%d slots of %s; activations on the host: "
		"%d of %d go there and back, %s each way per micro-batch)\n",
		st_plan_fmt_bytes(p->act_bytes, a), p->act_slots,
		st_plan_fmt_bytes(st_align_up(p->act_each_bytes, ST_PLAN_ACT_ALIGN), b), p->act_offloaded,
		p->units - 1, st_plan_fmt_bytes(p->act_copy_bytes, c));
}

/* The kept units as ranges ("9-12", "1,3-4"), or "none". */
static const char *recomp_units(const struct st_plan *p, char *buf, size_t n)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int u = 0; u < p->units && len < n; u++) {
		int v = u;

		if (!p->keep[u])
			continue;
		while (v + 1 < p->units && p->keep[v + 1])
			v++;
		len += (size_t)snprintf(buf + len, n - len, v > u ? "%s%d-%d" : "%s%d",
					len ? "," : "", u, v);
		u = v;
	}
	if (!buf[0])
		snprintf(buf, n, "none");
	return buf;
}

/* `strata plan`'s line for the saved forwards. */
static void recomp_print(const struct st_plan *p, int n_mb, FILE *f)
{
	char a[32], b[32], units[256];
	/* layer-first keeps each of the N micro-batches' forward */
	int n = p->n_keep * (p->schedule == ST_SCHEDULE_LAYER_FIRST ? n_mb : 1);

	fprintf(f, "        saved forwards  ");
	if (p->n_keep)
		fprintf(f, "%s (%d x %s: units %s keep their forward; recompute %s)\n",
			st_plan_fmt_bytes(st_plan_page_bytes(p->saved_each_bytes) * (uint64_t)n, a), n,
			st_plan_fmt_bytes(p->saved_each_bytes, b), recomp_units(p, units, sizeof(units)),
			st_recompute_name(p->recompute));
	else
		fprintf(f, "none (recompute %s: every backward recomputes its forward)\n",
			st_recompute_name(p->recompute));
}

void st_plan_print(const struct st_plan *p, const struct st_plan_input *in, FILE *f)
{
	const struct st_model_config *cfg = st_model_config(in->model);
	char a[32], b[32], c[32], d[32];

	fprintf(f, "model %.2fM params, %d layers, dim %d, %d heads, vocab %d, ctx %d | %d units\n",
		(double)st_model_param_count(in->model) / 1e6, cfg->n_layer, cfg->dim,
		cfg->n_head, cfg->vocab, cfg->ctx, p->units);
	fprintf(f, "batch B=%d T=%d accum %d | W %s | prefetch %d%s\n", in->batch, in->seq,
		in->grad_accum, in->bf16 ? "bf16" : "fp32", p->prefetch,
		!p->w_slots && !p->embed_slot ? " (W resident: nothing streamed)" : "");
	fprintf(f, "\nplacement       %-22s %-22s %s\n", "vram", "host", "nvme");
	for (int s = 0; s < ST_STATE_COUNT; s++) {
		fprintf(f, "  %s            ", st_state_name((enum st_state)s));
		for (int h = 0; h < ST_HOME_COUNT; h++) {
			int units;
			uint64_t bytes;
			char cell[64];

			st_plan_count(p, (enum st_state)s, (enum st_home)h, &units, &bytes);
			if (units)
				snprintf(cell, sizeof(cell), "%d units %s", units, st_plan_fmt_bytes(bytes, a));
			else
				snprintf(cell, sizeof(cell), "-");
			fprintf(f, h + 1 < ST_HOME_COUNT ? " %-22s" : " %s", cell);
		}
		fputc('\n', f);
	}
	print_split(p, f);
	fprintf(f, "\npools\n");
	if (p->w_slots) {
		fprintf(f, "  vram  W slots         %llu x %s", (unsigned long long)p->w_slots,
			st_plan_fmt_bytes(p->w_slot_bytes, a));
		if (p->embed_slot)
			fprintf(f, " + embedding %s", st_plan_fmt_bytes(p->embed_slot_bytes, b));
		fputc('\n', f);
	} else {
		fprintf(f, "  vram  W slots         none (W resident)\n");
	}
	act_print(p, f);
	fprintf(f, "        scratch         %s (model workspace %s)\n",
		st_plan_fmt_bytes(p->scratch_bytes, a), st_plan_fmt_bytes(p->work_bytes, b));
	recomp_print(p, in->grad_accum, f);
	fprintf(f, "        schedule        %s (%s)%s\n", st_schedule_name(p->schedule),
		p->schedule_why, p->schedule == ST_SCHEDULE_LAYER_FIRST ? "\n                        "
		"each unit runs every micro-batch while its W is in vram: W and G cross once a step"
									 : "");
	fprintf(f, "        update          %s (%s)\n", p->in_backward ? "in the backward"
		: "after the backward", p->update_why);
	if (p->alt_bytes)
		fprintf(f, "  nvme  P, M, V alternates %s (the update in the backward writes "
			"there until the norm is known)\n", st_plan_fmt_bytes(p->alt_bytes, a));
	fprintf(f, "  host  W staging       %s\n", st_plan_fmt_bytes(p->w_staging_bytes, a));
	fprintf(f, "        grad landing    %s\n", st_plan_fmt_bytes(p->grad_landing_bytes, a));
	fprintf(f, "        update staging  %s\n", st_plan_fmt_bytes(p->update_staging_bytes, a));
	for (int i = 0; i < p->n_pools; i++) /* only with --optim-state q8 */
		if (p->pools[i].id == ST_POOL_Q8_SCALES)
			fprintf(f, "        q8 scales M,V   %s (--optim-state q8: a scale per 64 "
				"elements)\n",
				st_plan_fmt_bytes(st_plan_page_bytes(p->pools[i].bytes), a));
	if (p->act_home == ST_HOME_HOST)
		fprintf(f, "        checkpoints     %s (%d x %s)\n", st_plan_fmt_bytes(p->act_host_bytes, a),
			p->act_offloaded, st_plan_fmt_bytes(st_align_up(p->act_each_bytes, ST_PLAN_ACT_ALIGN), b));
	fprintf(f, "\n  %-5s %-12s %-12s %-12s %s\n", "tier", "homes", "total", "budget",
		"minimum (with the other budgets as given)");
	for (int h = 0; h < ST_HOME_COUNT; h++) {
		if (h == ST_HOME_NVME && !in->have_nvme) {
			fprintf(f, "  nvme  (no --nvme)\n");
			continue;
		}
		fprintf(f, "  %-5s %-12s %-12s %-12s %s%s\n", st_home_name((enum st_home)h),
			st_plan_fmt_bytes(p->home_bytes[h], a), st_plan_fmt_bytes(p->total_bytes[h], b),
			st_plan_fmt_bytes(p->budget_bytes[h], c), st_plan_fmt_bytes(p->min_bytes[h], d),
			h == ST_HOME_NVME && !in->nvme_mem_bytes ? "  (budget: what the plan needs)" : "");
	}
	fprintf(f, "\ntraffic per step\n");
	fprintf(f, "  host -> vram  %s\n", st_plan_fmt_bytes(p->h2d_bytes, a));
	fprintf(f, "  vram -> host  %s\n", st_plan_fmt_bytes(p->d2h_bytes, a));
	fprintf(f, "  nvme -> host  %s\n", st_plan_fmt_bytes(p->nvme_read_bytes, a));
	fprintf(f, "  host -> nvme  %s\n", st_plan_fmt_bytes(p->nvme_write_bytes, a));
	if (p->world > 1) {
		static const char *stage_says[] = {
			"every rank holds every state", "P, M, V sharded",
			"G, P, M, V sharded", "W, G, P, M, V sharded" };

		fprintf(f, "\nZeRO stage %d at world %d (this is rank %d's plan; %s)\n", p->zero,
			p->world, p->rank, stage_says[p->zero]);
		fprintf(f, "  collectives per step (the comm's bytes: each call's full buffer)\n");
		for (int k = 0; k < 5; k++)
			if (p->comm_calls[k])
				fprintf(f, "    %-15s %6llu calls %s\n",
					k == 0 ? "allreduce" : k == 1 ? "reduce_scatter" : k == 2 ? "allgather"
					: k == 3 ? "alltoall" : "broadcast", (unsigned long long)p->comm_calls[k],
					st_plan_fmt_bytes(p->comm_bytes[k], a));
	}
	fprintf(f, "\ntime per step (predicted; the resources overlap)\n");
	fprintf(f, "  compute  %-10s at %.1f GFLOP/s (%s; recomputing %.3g GFLOP of it)\n",
		fmt_s(p->t_compute_s, a, 32), p->rates.compute_flops / 1e9,
		st_plan_rate_source(p, ST_RATE_COMPUTE), p->recompute_flops / 1e9);
	if (in->host_compute) {
		char b2[32];

		fprintf(f, "           (with W's widens %s at %.2f GB/s (%s) and the nvme sums %s "
			"at %.2f GB/s (%s) on the cores)\n", fmt_s(p->t_widen_s, a, 32),
			p->rates.widen_bps / 1e9, cores_source(p, ST_RATE_WIDEN),
			fmt_s(p->t_sums_s, b2, 32), p->rates.sum_bps / 1e9,
			cores_source(p, ST_RATE_SUM));
	}
	fprintf(f, "  copy     %-10s at %.2f GB/s (%s)\n", fmt_s(p->t_copy_s, a, 32),
		p->rates.copy_bps / 1e9, st_plan_rate_source(p, ST_RATE_COPY));
	fprintf(f, "  nvme     %-10s at %.2f / %.2f GB/s read / write (%s / %s)\n",
		fmt_s(p->t_nvme_s, a, 32), p->rates.nvme_read_bps / 1e9,
		p->rates.nvme_write_bps / 1e9, st_plan_rate_source(p, ST_RATE_NVME_READ),
		st_plan_rate_source(p, ST_RATE_NVME_WRITE));
	fprintf(f, "  adam     %-10s at %.2f GB/s (%s)\n", fmt_s(p->t_adam_s, a, 32),
		p->rates.adam_bps / 1e9, st_plan_rate_source(p, ST_RATE_ADAM));
	if (p->world > 1)
		fprintf(f, "  net      %-10s at %.2f GB/s (%s)\n", fmt_s(p->t_net_s, a, 32),
			p->rates.net_bps / 1e9, st_plan_rate_source(p, ST_RATE_NET));
	{
		char b2[32];

		/* in the backward: [0] up to the last backward (layer-first:
		 * the forwards), [1] it with the update beside it
		 * (plan_predict.c, phases_in_backward) */
		const char *fmt = !p->in_backward
					  ? "  phases   backward %s (bound by %s) + update %s (bound by %s)\n"
				  : p->schedule == ST_SCHEDULE_LAYER_FIRST
					  ? "  phases   forwards %s (bound by %s) + backwards with the "
					    "update %s (bound by %s)\n"
					  : "  phases   to the last backward %s (bound by %s) + the last "
					    "backward with the update %s (bound by %s)\n";

		fprintf(f, fmt,
			fmt_s(p->t_phase_s[0], a, 32), p->phase_bound[0],
			fmt_s(p->t_phase_s[1], b2, 32), p->phase_bound[1]);
	}
	fprintf(f, "  serial   %-10s fill and drain: one unit's share of the other lanes%s%s\n",
		fmt_s(p->t_serial_s, a, 32),
		p->in_backward ? ", once a step (none in a phase the disk binds)" : "",
		in->host_compute ? "\n           (cpu device: compute, adam and the copies share the "
				   "cores, so they add)" : "");
	fprintf(f, "  step     %-10s bound by %s\n", fmt_s(p->t_step_s, a, 32), p->bound);
	if (strcmp(p->bound, "compute") == 0)
		;
	else if (p->hide_accum)
		fprintf(f, "  compute-bound from --grad-accum %d (B*T*N = %lld tokens): step %s, "
			"%.0f tok/s\n", p->hide_accum,
			(long long)in->batch * in->seq * p->hide_accum, fmt_s(p->hide_step_s, a, 32),
			(double)in->batch * in->seq * p->hide_accum / p->hide_step_s);
	else if (p->hide_best_accum)
		fprintf(f, "  never compute-bound up to --grad-accum %d: %s\n"
			"  tokens/s within 10%% of the best from --grad-accum %d (step %s, "
			"%.0f tok/s)\n", ST_PLAN_ACCUM_MAX, p->hide_why, p->hide_best_accum,
			fmt_s(p->hide_best_step_s, a, 32),
			(double)in->batch * in->seq * p->hide_best_accum / p->hide_best_step_s);
}

const char *st_plan_kind_name(enum st_unit_kind k)
{
	return k == ST_UNIT_EMBED ? "embed" : k == ST_UNIT_BLOCK ? "block" : "head";
}

void st_plan_print_units(const struct st_plan *p, const struct st_plan_input *in, FILE *f)
{
	char a[32];

	fprintf(f, "\nunit  kind    elems      ");
	for (int s = 0; s < ST_STATE_COUNT; s++)
		fprintf(f, s + 1 < ST_STATE_COUNT ? " %-18s" : " %s",
			st_state_name((enum st_state)s));
	fputc('\n', f);
	for (int u = 0; u < p->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(in->model, u);

		fprintf(f, "  %-3d %-7s %-10llu", u, st_plan_kind_name(l->kind),
			(unsigned long long)l->elems);
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			char cell[48];

			snprintf(cell, sizeof(cell), "%s %s",
				 st_home_name(st_plan_home(p, u, (enum st_state)s)),
				 st_plan_fmt_bytes(p->state_bytes[u * ST_STATE_COUNT + s], a));
			fprintf(f, s + 1 < ST_STATE_COUNT ? " %-18s" : " %s", cell);
		}
		fputc('\n', f);
	}
}
